"""The IR text parser: :func:`from_text` reads what :func:`plait.ir.text.to_text` writes.

:class:`Parser` is a recursive-descent parser with one method per production of the grammar::

    graph     := header body
    header    := "graph" "(" input* ")"
    input     := KIND value ":" type
    body      := "{" node* outputs "}"
    node      := value ("," value)* "=" OP "(" operands? ")" attrs? ":" types
    operands  := operand ("," operand)*
    operand   := value | literal
    attrs     := "{" (NAME "=" literal ("," NAME "=" literal)*)? "}"
    literal   := keyword | string | list | number | dtype | dim
    list      := "[" (literal ("," literal)*)? "]"
    types     := type ("," type)*
    type      := "none" | SCALAR | DTYPE "[" (dim ("," dim)*)? "]" ("@" device)?
    outputs   := "return" (operand ("," operand)*)?

Every error is an :class:`IRParseError` naming the line, the column and what was expected. The
input and node productions first try their common form as :func:`plait.ir.text.to_text` prints
it (one regular expression each; a warm start parses IR text); what that does not accept takes
the general path, which gives the same result and the errors.

Example:
    >>> text = "graph(\\n  user %x: f32[3]\\n) {\\n  %0 = exp(%x) : f32[3]\\n  return %0\\n}"
    >>> g = from_text(text)
    >>> [n.op for n in g.nodes], str(parse_type("f32[4, s0]@cuda:0"))
    (['exp'], 'f32[4, s0]@cuda:0')
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from plait.ir.graph import INPUT_KINDS, Graph, Node, Operand, Value
from plait.ir.ops.registry import AttrError, OpDef, TypeRuleError, get_op
from plait.ir.types import DTYPES_BY_NAME, SCALAR_KINDS, NoneType, ScalarType, TensorType, Type
from plait.ir.verify import verify as run_verify
from plait.symbolic import DimParseError, parse_dim

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*")
_FLOAT_RE = re.compile(r"-?(?:\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|inf|nan)(?![\w.])")
_INT_RE = re.compile(r"-?\d+(?![\w.])")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORD_RE = re.compile(r"(?:true|false|none)(?!\w)")
_KEYWORDS = {"true": True, "false": False, "none": None}
_WS_RE = re.compile(r"[ \t\r\n]*")
_WS_LINE_RE = re.compile(r"[ \t\r]*")
_UINT_RE = re.compile(r"[0-9]+")
_DEVICE_RE = re.compile(r"cpu|cuda:\d+")
# NOTE: the common case of a type as to_text prints it (static dims): parsed in one match; any
# other text takes the general path, which gives the same result for what this accepts.
_STATIC_TYPE_RE = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*)\[((?:[0-9]+(?:, [0-9]+)*)?)\](?:@(cpu|cuda:[0-9]+))?(?!@)"
)
# NOTE: the common statement as to_text prints it: one result, operands and attributes without
# strings, parentheses or nested lists, one type; matched in one go, then checked piece by
# piece (Parser.fast_node). Anything else (or anything wrong) takes the general path, which
# gives the same result for what this accepts, and the errors.
_FAST_STMT_RE = re.compile(
    r"%([A-Za-z0-9_][A-Za-z0-9_.]*) = ([A-Za-z_][A-Za-z0-9_]*)\(([^()\[\]{}\"\n]*)\)"
    r"(?: \{([^(){}\"\n]*)\})? : ([^\n]*?)[ \t\r]*\n"
)
_FAST_INPUT_RE = re.compile(r"([a-z]+) %([A-Za-z0-9_][A-Za-z0-9_.]*): ([^\n]*?)[ \t\r]*\n")
_FAST_ATTR_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\[[^\[\]]*\]|[^,\[\]]+)(?:, |$)")
# NOTE: the last line of a graph as to_text writes it: "  return %a, %b\n}" (operands without
# commas in them: value names and numbers)
_RETURN_RE = re.compile(r"\n[ \t]*return(?: ([^\n{},]+(?:, [^\n{},]+)*))?[ \t]*\n\}\s*\Z")
_NO_VALUE = object()


class IRParseError(ValueError):
    """Malformed IR text; names the 1-based line and column and what was expected."""

    def __init__(self, message: str, line: int, column: int, line_text: str) -> None:
        super().__init__(
            f"line {line}, column {column}: {message}\n  {line_text}\n  {' ' * (column - 1)}^"
        )
        self.line, self.column, self.reason = line, column, message


class Parser:
    """Parses one IR text: :meth:`graph` (the whole text) or :meth:`type` (one type).

    ``pos`` is the offset of the next character to read; ``env`` maps each value name defined so
    far to its value (an operand may only name a value defined before it).
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.env: dict[str, Value] = {}

    # --- lexical helpers -----------------------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> IRParseError:
        """An :class:`IRParseError` at ``pos`` (the cursor by default)."""
        pos = self.pos if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        start = self.text.rfind("\n", 0, pos) + 1
        end = self.text.find("\n", pos)
        line_text = self.text[start : end if end >= 0 else len(self.text)]
        return IRParseError(message, line, pos - start + 1, line_text)

    def skip_ws(self, newlines: bool = True) -> None:
        m = (_WS_RE if newlines else _WS_LINE_RE).match(self.text, self.pos)
        self.pos = m.end()  # type: ignore[union-attr]  # NOTE: matches the empty string

    def peek(self, s: str) -> bool:
        self.skip_ws()
        return self.text.startswith(s, self.pos)

    def expect(self, s: str) -> None:
        self.skip_ws()
        if not self.text.startswith(s, self.pos):
            raise self.error(f"expected {s!r}, found {self._found()!r}")
        self.pos += len(s)

    def match(self, pattern: re.Pattern[str], what: str) -> str:
        self.skip_ws()
        m = pattern.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}, found {self._found()!r}")
        self.pos = m.end()
        return m.group(0)

    def _found(self) -> str:
        return self.text[self.pos : self.pos + 12].split("\n")[0] or "end of text"

    def at_end(self) -> None:
        """Only whitespace is left after the graph."""
        self.skip_ws()
        if self.pos != len(self.text):
            raise self.error("unexpected text after the graph")

    # --- the graph -----------------------------------------------------------------------------
    def graph(self, inputs_only: bool = False) -> Graph:
        """``graph := header body``; with ``inputs_only`` only the header (no nodes, no
        outputs)."""
        graph = Graph()
        self.header(graph)
        if inputs_only:
            return graph
        self.body(graph)
        self.at_end()
        return graph

    def header(self, graph: Graph) -> None:
        """``header := "graph" "(" input* ")"``."""
        self.expect("graph")
        self.expect("(")
        while not self.peek(")"):
            graph.inputs.append(self.fast_input() or self.input())
        self.expect(")")

    def input(self) -> Value:
        """``input := KIND value ":" type``."""
        pos = self.pos
        kind = self.match(_IDENT_RE, "an input kind (" + ", ".join(INPUT_KINDS) + ")")
        if kind not in INPUT_KINDS:
            raise self.error(f"unknown input kind {kind!r}; expected one of {INPUT_KINDS}", pos)
        self.skip_ws()
        pos = self.pos
        name = self.value_name()
        self.expect(":")
        v = Value(name, self.type(), kind=kind)
        self.define(v, pos)
        return v

    def fast_input(self) -> Value | None:
        """An input line in its common form; None (nothing consumed) otherwise."""
        m = _FAST_INPUT_RE.match(self.text, self.pos)
        if m is None or m.group(1) not in INPUT_KINDS or m.group(2) in self.env:
            return None
        t = _fast_type(m.group(3))
        if t is None:
            return None
        v = Value(m.group(2), t, kind=m.group(1))
        self.env[v.name] = v
        self.pos = m.end()
        return v

    def body(self, graph: Graph) -> None:
        """``body := "{" node* outputs "}"``."""
        self.expect("{")
        while True:
            self.skip_ws()
            if self.peek("return"):
                break
            node = self.fast_node(len(graph.nodes)) or self.node(len(graph.nodes))
            graph.nodes.append(node)
        graph.outputs.extend(self.outputs())
        self.expect("}")

    def node(self, node_id: int) -> Node:
        """``node := value ("," value)* "=" OP "(" operands? ")" attrs? ":" types``."""
        line_start = self.pos
        names = [self.value_name()]
        while self.peek(","):
            self.expect(",")
            names.append(self.value_name())
        self.expect("=")
        self.skip_ws()
        op_pos = self.pos
        opdef = self.op()
        self.expect("(")
        inputs = [] if self.peek(")") else self.operands(",)")
        self.expect(")")
        attrs = self.attrs() if self.peek("{") else {}
        self.expect(":")
        types = self.types()
        if len(types) != len(names):
            raise self.error(f"{len(names)} results but {len(types)} types", line_start)
        try:
            full = opdef.check_attrs(attrs)
        except (AttrError, TypeRuleError) as exc:
            raise self.error(str(exc), op_pos) from None
        node = Node(node_id, opdef.name, tuple(inputs), full)
        node.outputs = tuple(Value(n, t, node, i) for i, (n, t) in enumerate(zip(names, types)))
        for v in node.outputs:
            self.define(v, line_start)
        return node

    def fast_node(self, node_id: int) -> Node | None:
        """The node at the cursor in its common form; None (nothing consumed) when it is not in
        that form or is not right: :meth:`node` then reads it."""
        m = _FAST_STMT_RE.match(self.text, self.pos)
        if m is None:
            return None
        name, op_name, args, attr_text, type_text = m.groups()
        env = self.env
        if name in env:
            return None
        try:
            opdef = get_op(op_name)
        except KeyError:
            return None
        inputs: list[Operand] = []
        for token in args.split(", ") if args else ():
            if token.startswith("%"):
                v = env.get(token[1:])
                if v is None:
                    return None
                inputs.append(v)
            else:
                value = _fast_literal(token)
                if value is _NO_VALUE:
                    return None
                inputs.append(value)
        attrs = _fast_attrs(attr_text)
        t = _fast_type(type_text)
        if attrs is None or t is None:
            return None
        try:
            full = opdef.check_attrs(attrs)
        except (AttrError, TypeRuleError):
            return None
        node = Node(node_id, op_name, tuple(inputs), full)
        node.outputs = (Value(name, t, node, 0),)
        env[name] = node.outputs[0]
        self.pos = m.end()
        return node

    def op(self) -> OpDef:
        """``OP``: a registered op's name."""
        pos = self.pos
        name = self.match(_IDENT_RE, "an op name")
        try:
            return get_op(name)
        except KeyError as exc:
            raise self.error(str(exc.args[0]), pos) from None

    def outputs(self) -> list[Operand]:
        """``outputs := "return" (operand ("," operand)*)?`` (on the return line)."""
        self.expect("return")
        self.skip_ws(newlines=False)
        return [] if self.peek("}") else self.operands(",}")

    # --- operands and values -------------------------------------------------------------------
    def operands(self, stops: str) -> list[Operand]:
        """``operands := operand ("," operand)*``."""
        out = [self.operand(stops)]
        while self.peek(","):
            self.expect(",")
            out.append(self.operand(stops))
        return out

    def operand(self, stops: str) -> Operand:
        """``operand := value | literal``; a value must be defined before its use."""
        self.skip_ws()
        if self.text.startswith("%", self.pos):
            pos = self.pos
            name = self.value_name()
            if name not in self.env:
                raise self.error(f"value %{name} is used before it is defined", pos)
            return self.env[name]
        return self.literal(stops)

    def value_name(self) -> str:
        """``value := "%" NAME``."""
        self.expect("%")
        return self.match(_NAME_RE, "a value name")

    def define(self, v: Value, pos: int) -> None:
        if v.name in self.env:
            raise self.error(f"value %{v.name} is defined twice (SSA)", pos)
        self.env[v.name] = v

    # --- attributes and literals ---------------------------------------------------------------
    def attrs(self) -> dict[str, Any]:
        """``attrs := "{" (NAME "=" literal ("," NAME "=" literal)*)? "}"``."""
        attrs: dict[str, Any] = {}
        self.expect("{")
        while not self.peek("}"):
            key = self.match(_IDENT_RE, "an attribute name")
            self.expect("=")
            attrs[key] = self.literal(",}")
            if not self.peek("}"):
                self.expect(",")
        self.expect("}")
        return attrs

    def literal(self, stops: str) -> Any:
        """``literal := keyword | string | list | number | dtype | dim``; ``stops``: the
        characters that end a dim expression here."""
        self.skip_ws()
        first = self.text[self.pos : self.pos + 1]
        if first == '"':
            return self.string()
        if first == "[":
            return self.list_literal()
        if first == "(":
            return self.dim(stops)
        for kind in (self.keyword, self.number, self.dtype):
            value = kind()
            if value is not _NO_VALUE:
                return value
        raise self.error(
            "expected a literal (number, true/false, none, string, list, dtype, "
            "or a parenthesized dim expression)"
        )

    def keyword(self) -> Any:
        """``keyword := "true" | "false" | "none"`` (``_NO_VALUE`` when the cursor is not at
        one)."""
        m = _KEYWORD_RE.match(self.text, self.pos)
        if not m:
            return _NO_VALUE
        self.pos = m.end()
        return _KEYWORDS[m.group(0)]

    def number(self) -> Any:
        """``number``: a float (``1.5``, ``1e-07``, ``-inf``, ``nan``) or an int (``_NO_VALUE``
        when the cursor is not at one)."""
        for pattern, convert in ((_FLOAT_RE, float), (_INT_RE, int)):
            m = pattern.match(self.text, self.pos)
            if m:
                self.pos = m.end()
                return convert(m.group(0))
        return _NO_VALUE

    def dtype(self) -> Any:
        """``dtype``: a dtype's name (``f32``; ``_NO_VALUE`` when the cursor is not at one)."""
        m = _IDENT_RE.match(self.text, self.pos)
        if not m or m.group(0) not in DTYPES_BY_NAME:
            return _NO_VALUE
        self.pos = m.end()
        return DTYPES_BY_NAME[m.group(0)]

    def string(self) -> str:
        """``string``: a JSON string literal."""
        start = self.pos
        try:
            value, end = json.JSONDecoder().raw_decode(self.text, self.pos)
        except json.JSONDecodeError:
            raise self.error("unterminated or invalid string", start) from None
        self.pos = end
        return str(value)

    def list_literal(self) -> tuple[Any, ...]:
        """``list := "[" (literal ("," literal)*)? "]"``, read as a tuple."""
        self.expect("[")
        items: list[Any] = []
        if not self.peek("]"):
            items.append(self.literal(",]"))
            while self.peek(","):
                self.expect(",")
                items.append(self.literal(",]"))
        self.expect("]")
        return tuple(items)

    # --- types ---------------------------------------------------------------------------------
    def types(self) -> list[Type]:
        """``types := type ("," type)*``."""
        types = [self.type()]
        while self.peek(","):
            self.expect(",")
            types.append(self.type())
        return types

    def type(self) -> Type:
        """``type := "none" | SCALAR | DTYPE "[" (dim ("," dim)*)? "]" ("@" device)?``."""
        self.skip_ws()
        start = self.pos
        m = _STATIC_TYPE_RE.match(self.text, start)
        if m and m.group(1) in DTYPES_BY_NAME:
            static = tuple(int(d) for d in m.group(2).split(", ")) if m.group(2) else ()
            try:
                t = TensorType(static, DTYPES_BY_NAME[m.group(1)], m.group(3) or "cpu")
            except (ValueError, TypeError) as exc:
                raise self.error(str(exc), start) from None
            self.pos = m.end()
            return t
        word = self.match(_IDENT_RE, "a type")
        if word == "none":
            return NoneType()
        if word in SCALAR_KINDS and not self.text.startswith("[", self.pos):
            return ScalarType(word)
        if word not in DTYPES_BY_NAME:
            raise self.error(
                f"unknown dtype {word!r}; expected one of {', '.join(DTYPES_BY_NAME)}", start
            )
        self.expect("[")
        dims: list[Any] = []
        if not self.peek("]"):
            dims.append(self.dim(",]"))
            while self.peek(","):
                self.expect(",")
                dims.append(self.dim(",]"))
        self.expect("]")
        device = self.device() if self.text.startswith("@", self.pos) else "cpu"
        try:
            return TensorType(tuple(dims), DTYPES_BY_NAME[word], device)
        except (ValueError, TypeError) as exc:
            raise self.error(str(exc), start) from None

    def device(self) -> str:
        """``device := "@" ("cpu" | "cuda:" N)``."""
        self.pos += 1
        return self.match(_DEVICE_RE, "a device (cpu, cuda:N)")

    def dim(self, stops: str) -> Any:
        """``dim``: an integer, or a dim expression up to a top-level character of ``stops``."""
        raw, start = self._balanced_until(stops)
        if _UINT_RE.fullmatch(raw):
            return int(raw)
        try:
            return parse_dim(raw)
        except (DimParseError, ValueError) as exc:
            offset = exc.pos if isinstance(exc, DimParseError) else 0
            raise self.error(f"bad dimension {raw!r}: {exc}", start + offset) from None

    def _balanced_until(self, stops: str) -> tuple[str, int]:
        """Raw text up to a top-level stop character, and where it starts."""
        self.skip_ws()
        start, depth = self.pos, 0
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "(":
                depth += 1
            elif c == ")" and depth:
                depth -= 1
            elif (depth == 0 and c in stops) or c == "\n":
                break
            self.pos += 1
        return self.text[start : self.pos].strip(), start


def _fast_literal(token: str) -> Any:
    """A plain literal (keyword, number, dtype) as :meth:`Parser.literal` reads it, else
    ``_NO_VALUE``."""
    if token in _KEYWORDS:
        return _KEYWORDS[token]
    if _FLOAT_RE.fullmatch(token):
        return float(token)
    if _INT_RE.fullmatch(token):
        return int(token)
    return DTYPES_BY_NAME.get(token, _NO_VALUE)


def _fast_attrs(text: str | None) -> dict[str, Any] | None:
    """The attributes of a node in their common form (plain literals, flat lists); None
    otherwise."""
    if not text:
        return {}
    attrs: dict[str, Any] = {}
    pos = 0
    while pos < len(text):
        m = _FAST_ATTR_RE.match(text, pos)
        if not m or m.group(1) in attrs:
            return None
        raw = m.group(2)
        if raw.startswith("["):
            inner = raw[1:-1]
            items = [_fast_literal(t) for t in inner.split(", ")] if inner else []
            if any(v is _NO_VALUE for v in items):
                return None
            attrs[m.group(1)] = tuple(items)
        else:
            value = _fast_literal(raw)
            if value is _NO_VALUE:
                return None
            attrs[m.group(1)] = value
        pos = m.end()
    return attrs


@functools.lru_cache(maxsize=4096)
def _fast_type(text: str) -> TensorType | None:
    # NOTE: memoized by its text: a TensorType is immutable (frozen), so values may share one,
    # and a graph repeats few types many times (every weight of a layer, every activation)
    m = _STATIC_TYPE_RE.fullmatch(text)
    if not m or m.group(1) not in DTYPES_BY_NAME:
        return None
    static = tuple(int(d) for d in m.group(2).split(", ")) if m.group(2) else ()
    try:
        return TensorType(static, DTYPES_BY_NAME[m.group(1)], m.group(3) or "cpu")
    except (ValueError, TypeError):
        return None


def parse_type(text: str) -> Type:
    """Parse one type, e.g. ``f32[4, s0]@cuda:0``."""
    parser = Parser(text)
    t = parser.type()
    parser.skip_ws()
    if parser.pos != len(text):
        raise parser.error("unexpected text after the type")
    return t


def from_text(text: str, verify: bool = True, inputs_only: bool = False) -> Graph:
    """Parse IR text into a graph (and verify it unless ``verify=False``); ``inputs_only``:
    only the graph's inputs (no nodes, no outputs; never verified)."""
    graph = Parser(text).graph(inputs_only)
    if verify and not inputs_only:
        run_verify(graph)
    return graph


def graph_interface(text: str) -> tuple[list[Value], list[str]]:
    """The inputs of the graph ``text`` writes (as :func:`from_text` parses them) and the names
    of the values it returns, without parsing its nodes: what a program's calling convention
    needs. Raises ``ValueError`` (an :class:`IRParseError`) where ``from_text`` would for these
    parts; a text whose return line this cannot read is parsed whole.

    Example:
        >>> import torch
        >>> from plait.ir import GraphBuilder, TensorType, to_text
        >>> gb = GraphBuilder()
        >>> x = gb.input("x", TensorType((2,), torch.float32))
        >>> gb.output(gb.call("relu", x))
        >>> inputs, returned = graph_interface(to_text(gb.build()))
        >>> [v.name for v in inputs], len(returned)
        (['x'], 1)
    """
    inputs = from_text(text, inputs_only=True).inputs
    m = _RETURN_RE.search(text)
    if m is None:
        graph = from_text(text, verify=False)
        return graph.inputs, [o.name for o in graph.outputs if isinstance(o, Value)]
    tokens = m.group(1).split(", ") if m.group(1) else []
    if not all(_NAME_RE.fullmatch(t[1:]) if t.startswith("%") else _fast_literal(t) is not
               _NO_VALUE for t in tokens):  # fmt: skip
        graph = from_text(text, verify=False)
        return graph.inputs, [o.name for o in graph.outputs if isinstance(o, Value)]
    return inputs, [t[1:] for t in tokens if t.startswith("%")]
