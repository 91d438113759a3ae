"""The IR's text form: print with :func:`to_text`, parse back with :func:`from_text`.

The round trip is exact: ``to_text(from_text(to_text(g))) == to_text(g)``. Attributes equal to
their declared default are left out of the text; the parser fills them back in.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType, to_text, from_text
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((2, 3), torch.float32))
    >>> b.output(b.call("sum", x, dims=[1]))
    >>> print(to_text(b.build()))
    graph(
      user %x: f32[2, 3]
    ) {
      %0 = sum(%x) {dims=[1]} : f32[2]
      return %0
    }
    >>> to_text(from_text(to_text(b.graph))) == to_text(b.graph)
    True
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import sympy
import torch

from plait.ir.graph import INPUT_KINDS, Graph, Node, Operand, Value
from plait.ir.types import (
    DTYPES_BY_NAME,
    SCALAR_KINDS,
    NoneType,
    ScalarType,
    TensorType,
    Type,
    dtype_name,
)
from plait.symbolic import DimParseError, dim_to_text, parse_dim

RESERVED = {"true", "false", "none", "inf", "nan", *DTYPES_BY_NAME, *SCALAR_KINDS}
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*")
_FLOAT_RE = re.compile(r"-?(?:\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|inf|nan)(?![\w.])")
_INT_RE = re.compile(r"-?\d+(?![\w.])")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORD_RE = re.compile(r"(?:true|false|none)(?!\w)")
_KEYWORDS = {"true": True, "false": False, "none": None}
_WS_RE = re.compile(r"[ \t\r\n]*")
_WS_LINE_RE = re.compile(r"[ \t\r]*")
_UINT_RE = re.compile(r"[0-9]+")
# NOTE: the common case of a type as to_text prints it (static dims): parsed in one match; any
# other text takes the general path, which gives the same result for what this accepts.
_STATIC_TYPE_RE = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*)\[((?:[0-9]+(?:, [0-9]+)*)?)\](?:@(cpu|cuda:[0-9]+))?(?!@)"
)
# NOTE: the common statement as to_text prints it: one result, operands and attributes without
# strings, parentheses or nested lists, one type; matched in one go, then checked piece by
# piece (_fast_statement). Anything else (or anything wrong) takes the general path, which
# gives the same result for what this accepts, and the errors.
_FAST_STMT_RE = re.compile(
    r"%([A-Za-z0-9_][A-Za-z0-9_.]*) = ([A-Za-z_][A-Za-z0-9_]*)\(([^()\[\]{}\"\n]*)\)"
    r"(?: \{([^(){}\"\n]*)\})? : ([^\n]*?)[ \t\r]*\n"
)
_FAST_INPUT_RE = re.compile(r"([a-z]+) %([A-Za-z0-9_][A-Za-z0-9_.]*): ([^\n]*?)[ \t\r]*\n")
_FAST_ATTR_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\[[^\[\]]*\]|[^,\[\]]+)(?:, |$)")
_NO_VALUE = object()


# --- printing ----------------------------------------------------------------------------------
def format_value(v: Any) -> str:
    """Text of a literal operand or attribute value."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    if isinstance(v, sympy.Expr):
        names = {str(s) for s in v.free_symbols} & RESERVED
        if names:
            raise ValueError(f"symbol names {sorted(names)} are reserved words in the IR text")
        return f"({dim_to_text(v)})"
    if isinstance(v, tuple):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


def format_type(t: Type) -> str:
    return str(t)


def format_operand(o: Operand) -> str:
    return f"%{o.name}" if isinstance(o, Value) else format_value(o)


def format_attrs(attrs: Mapping[str, Any]) -> str:
    if not attrs:
        return ""
    return " {" + ", ".join(f"{k}={format_value(v)}" for k, v in attrs.items()) + "}"


def node_text(
    node: Node, name: Callable[[Value], str], attrs: Mapping[str, Any] | None = None
) -> str:
    outs = ", ".join(f"%{name(v)}" for v in node.outputs)
    args = ", ".join(
        f"%{name(o)}" if isinstance(o, Value) else format_value(o) for o in node.inputs
    )
    types = ", ".join(format_type(v.type) for v in node.outputs)
    return (
        f"{outs} = {node.op}({args}){format_attrs(node.attrs if attrs is None else attrs)}"
        f" : {types}"
    )


def _non_default_attrs(node: Node) -> dict[str, Any]:
    from plait.ir.ops import get_op

    try:
        opdef = get_op(node.op)
    except KeyError:
        return dict(node.attrs)
    defaults = {a.name: a.default for a in opdef.attrs if not a.required}
    return {
        k: v for k, v in node.attrs.items() if k not in defaults or not _same_attr(v, defaults[k])
    }


def _same_attr(a: Any, b: Any) -> bool:
    return type(a) is type(b) and format_value(a) == format_value(b)


def to_text(graph: Graph) -> str:
    lines = ["graph("]
    lines += [f"  {v.kind} %{v.name}: {format_type(v.type)}" for v in graph.inputs]
    lines.append(") {")
    lines += ["  " + node_text(n, lambda v: v.name, _non_default_attrs(n)) for n in graph.nodes]
    lines.append("  return " + ", ".join(format_operand(o) for o in graph.outputs))
    lines.append("}")
    return "\n".join(lines)


# --- parsing -----------------------------------------------------------------------------------
class IRParseError(ValueError):
    """Malformed IR text; names the 1-based line and column and what was expected."""

    def __init__(self, message: str, line: int, column: int, line_text: str) -> None:
        super().__init__(
            f"line {line}, column {column}: {message}\n  {line_text}\n  {' ' * (column - 1)}^"
        )
        self.line, self.column, self.reason = line, column, message


class _Cursor:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str, pos: int | None = None) -> IRParseError:
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
            found = self.text[self.pos : self.pos + 12].split("\n")[0] or "end of text"
            raise self.error(f"expected {s!r}, found {found!r}")
        self.pos += len(s)

    def match(self, pattern: re.Pattern[str], what: str) -> str:
        self.skip_ws()
        m = pattern.match(self.text, self.pos)
        if not m:
            found = self.text[self.pos : self.pos + 12].split("\n")[0] or "end of text"
            raise self.error(f"expected {what}, found {found!r}")
        self.pos = m.end()
        return m.group(0)

    def value_name(self) -> str:
        self.expect("%")
        return self.match(_NAME_RE, "a value name")

    def balanced_until(self, stops: str) -> tuple[str, int]:
        """Raw text up to a top-level stop character (used for dim expressions)."""
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

    def dim(self, stops: str) -> Any:
        raw, start = self.balanced_until(stops)
        if _UINT_RE.fullmatch(raw):
            return int(raw)
        try:
            return parse_dim(raw)
        except (DimParseError, ValueError) as exc:
            offset = exc.pos if isinstance(exc, DimParseError) else 0
            raise self.error(f"bad dimension {raw!r}: {exc}", start + offset) from None

    def type(self) -> Type:
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
        device = "cpu"
        if self.text.startswith("@", self.pos):
            self.pos += 1
            device = self.match(re.compile(r"cpu|cuda:\d+"), "a device (cpu, cuda:N)")
        try:
            return TensorType(tuple(dims), DTYPES_BY_NAME[word], device)
        except (ValueError, TypeError) as exc:
            raise self.error(str(exc), start) from None

    def literal(self, stops: str) -> Any:
        self.skip_ws()
        m = _KEYWORD_RE.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return _KEYWORDS[m.group(0)]
        if self.text.startswith('"', self.pos):
            return self._string()
        if self.text.startswith("[", self.pos):
            self.pos += 1
            items: list[Any] = []
            if not self.peek("]"):
                items.append(self.literal(",]"))
                while self.peek(","):
                    self.expect(",")
                    items.append(self.literal(",]"))
            self.expect("]")
            return tuple(items)
        for pattern, convert in ((_FLOAT_RE, float), (_INT_RE, int)):
            m = pattern.match(self.text, self.pos)
            if m:
                self.pos = m.end()
                return convert(m.group(0))
        m = _IDENT_RE.match(self.text, self.pos)
        if m and m.group(0) in DTYPES_BY_NAME:
            self.pos = m.end()
            return DTYPES_BY_NAME[m.group(0)]
        if self.text.startswith("(", self.pos):
            return self.dim(stops)
        raise self.error(
            "expected a literal (number, true/false, none, string, list, dtype, "
            "or a parenthesized dim expression)"
        )

    def _string(self) -> str:
        start = self.pos
        decoder = json.JSONDecoder()
        try:
            value, end = decoder.raw_decode(self.text, self.pos)
        except json.JSONDecodeError:
            raise self.error("unterminated or invalid string", start) from None
        self.pos = end
        return str(value)


def _fast_literal(token: str) -> Any:
    """A plain literal (keyword, number, dtype) as the general parser reads it, else
    ``_NO_VALUE``."""
    if token in _KEYWORDS:
        return _KEYWORDS[token]
    if _FLOAT_RE.fullmatch(token):
        return float(token)
    if _INT_RE.fullmatch(token):
        return int(token)
    return DTYPES_BY_NAME.get(token, _NO_VALUE)


def _fast_attrs(text: str | None) -> dict[str, Any] | None:
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
    cur = _Cursor(text)
    t = cur.type()
    cur.skip_ws()
    if cur.pos != len(text):
        raise cur.error("unexpected text after the type")
    return t


def graph_interface(text: str) -> tuple[list[Value], list[str]]:
    """The inputs of the graph ``text`` writes (as :func:`from_text` parses them) and the names
    of the values it returns, without parsing its nodes: what a program's calling convention
    needs. Raises ``ValueError`` (an :class:`IRParseError`) where ``from_text`` would for these
    parts; a text whose return line this cannot read is parsed whole.

    Example:
        >>> import torch
        >>> from plait.ir import GraphBuilder, TensorType
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


# NOTE: the last line of a graph as to_text writes it: "  return %a, %b\n}" (operands without
# commas in them: value names and numbers)
_RETURN_RE = re.compile(r"\n[ \t]*return(?: ([^\n{},]+(?:, [^\n{},]+)*))?[ \t]*\n\}\s*\Z")


def from_text(text: str, verify: bool = True, inputs_only: bool = False) -> Graph:
    """Parse IR text into a graph (and verify it unless ``verify=False``); ``inputs_only``:
    only the graph's inputs (no nodes, no outputs; never verified)."""
    from plait.ir.ops import AttrError, TypeRuleError, get_op

    cur = _Cursor(text)
    graph = Graph()
    env: dict[str, Value] = {}

    def define(name: str, v: Value, pos: int) -> None:
        if name in env:
            raise cur.error(f"value %{name} is defined twice (SSA)", pos)
        env[name] = v

    def operand(stops: str) -> Operand:
        cur.skip_ws()
        if cur.text.startswith("%", cur.pos):
            pos = cur.pos
            name = cur.value_name()
            if name not in env:
                raise cur.error(f"value %{name} is used before it is defined", pos)
            return env[name]
        return cur.literal(stops)

    def fast_statement() -> bool:
        """Parse the statement at the cursor in its common form; False (nothing consumed)
        when it is not in that form or is not right: the general path then reads it."""
        m = _FAST_STMT_RE.match(cur.text, cur.pos)
        if m is None:
            return False
        name, op_name, args, attr_text, type_text = m.groups()
        if name in env:
            return False
        try:
            opdef = get_op(op_name)
        except KeyError:
            return False
        inputs: list[Operand] = []
        for token in args.split(", ") if args else ():
            if token.startswith("%"):
                v = env.get(token[1:])
                if v is None:
                    return False
                inputs.append(v)
            else:
                value = _fast_literal(token)
                if value is _NO_VALUE:
                    return False
                inputs.append(value)
        attrs = _fast_attrs(attr_text)
        t = _fast_type(type_text)
        if attrs is None or t is None:
            return False
        try:
            full = opdef.check_attrs(attrs)
        except (AttrError, TypeRuleError):
            return False
        node = Node(len(graph.nodes), op_name, tuple(inputs), full)
        node.outputs = (Value(name, t, node, 0),)
        env[name] = node.outputs[0]
        graph.nodes.append(node)
        cur.pos = m.end()
        return True

    def fast_input() -> bool:
        """An input line in its common form (False, nothing consumed, otherwise)."""
        m = _FAST_INPUT_RE.match(cur.text, cur.pos)
        if m is None or m.group(1) not in INPUT_KINDS or m.group(2) in env:
            return False
        t = _fast_type(m.group(3))
        if t is None:
            return False
        v = Value(m.group(2), t, kind=m.group(1))
        env[v.name] = v
        graph.inputs.append(v)
        cur.pos = m.end()
        return True

    cur.expect("graph")
    cur.expect("(")
    while not cur.peek(")"):
        cur.skip_ws()
        if fast_input():
            continue
        pos = cur.pos
        kind = cur.match(_IDENT_RE, "an input kind (" + ", ".join(INPUT_KINDS) + ")")
        if kind not in INPUT_KINDS:
            raise cur.error(f"unknown input kind {kind!r}; expected one of {INPUT_KINDS}", pos)
        cur.skip_ws()
        pos = cur.pos
        name = cur.value_name()
        cur.expect(":")
        v = Value(name, cur.type(), kind=kind)
        define(name, v, pos)
        graph.inputs.append(v)
    cur.expect(")")
    if inputs_only:
        return graph
    cur.expect("{")
    while True:
        cur.skip_ws()
        if cur.peek("return"):
            cur.expect("return")
            break
        if fast_statement():
            continue
        line_start = cur.pos
        names = [cur.value_name()]
        while cur.peek(","):
            cur.expect(",")
            names.append(cur.value_name())
        cur.expect("=")
        cur.skip_ws()
        op_pos = cur.pos
        op_name = cur.match(_IDENT_RE, "an op name")
        try:
            opdef = get_op(op_name)
        except KeyError as exc:
            raise cur.error(str(exc.args[0]), op_pos) from None
        cur.expect("(")
        inputs: list[Operand] = []
        if not cur.peek(")"):
            inputs.append(operand(",)"))
            while cur.peek(","):
                cur.expect(",")
                inputs.append(operand(",)"))
        cur.expect(")")
        attrs: dict[str, Any] = {}
        if cur.peek("{"):
            cur.expect("{")
            while not cur.peek("}"):
                key = cur.match(_IDENT_RE, "an attribute name")
                cur.expect("=")
                attrs[key] = cur.literal(",}")
                if not cur.peek("}"):
                    cur.expect(",")
            cur.expect("}")
        cur.expect(":")
        types = [cur.type()]
        while cur.peek(","):
            cur.expect(",")
            types.append(cur.type())
        if len(types) != len(names):
            raise cur.error(f"{len(names)} results but {len(types)} types", line_start)
        try:
            full = opdef.check_attrs(attrs)
        except (AttrError, TypeRuleError) as exc:
            raise cur.error(str(exc), op_pos) from None
        node = Node(len(graph.nodes), op_name, tuple(inputs), full)
        node.outputs = tuple(Value(n, t, node, i) for i, (n, t) in enumerate(zip(names, types)))
        for v in node.outputs:
            define(v.name, v, line_start)
        graph.nodes.append(node)
    cur.skip_ws(newlines=False)
    if not cur.peek("}"):
        graph.outputs.append(operand(",}"))
        while cur.peek(","):
            cur.expect(",")
            graph.outputs.append(operand(",}"))
    cur.expect("}")
    cur.skip_ws()
    if cur.pos != len(text):
        raise cur.error("unexpected text after the graph")
    if verify:
        from plait.ir.verify import verify as run_verify

        run_verify(graph)
    return graph
