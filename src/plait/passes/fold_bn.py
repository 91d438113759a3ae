"""Fold inference BatchNorm into the preceding conv2d or linear when all their parameters are
constants (frozen) and the conv/linear output has no other user."""

from __future__ import annotations

from typing import Any

import torch

from plait.ir import Graph, TensorType, Value
from plait.passes.manager import CONTRACT, PassContext, register_pass
from plait.passes.rewrite import Match, Op, Rule, Var, apply_rules


def _const(o: Any, graph: Graph) -> torch.Tensor | None:
    if o is None:
        return None
    if isinstance(o, Value) and o.kind == "const" and o.name in graph.constants:
        t = graph.constants[o.name]
        return t if isinstance(t, torch.Tensor) else None
    return None


def _fold(graph: Graph) -> Any:
    def rewrite(m: Match, emit: Any) -> Any:
        if not _channels_match(m):
            return None
        producer, bn = m["producer"], m.root
        w_val, b_val = producer.inputs[1], producer.inputs[2]
        w = _const(w_val, graph)
        names = ("weight", "bias", "running_mean", "running_var")
        stats = {k: _const(o, graph) for k, o in zip(names, bn.inputs[1:])}
        if w is None or (b_val is not None and _const(b_val, graph) is None):
            return None
        if stats["running_mean"] is None or stats["running_var"] is None:
            return None
        if any(
            stats[k] is None and bn.inputs[1 + i] is not None
            for i, k in enumerate(("weight", "bias"))
        ):
            return None
        # NOTE: computed in float64, rounded once to the parameter dtype.
        f64 = torch.float64
        gamma = stats["weight"].to(f64) if stats["weight"] is not None else 1.0
        beta = stats["bias"].to(f64) if stats["bias"] is not None else 0.0
        scale = gamma / torch.sqrt(stats["running_var"].to(f64) + bn.attrs["eps"])
        bias0 = _const(b_val, graph)
        b0 = bias0.to(f64) if bias0 is not None else torch.zeros_like(scale)
        shape = (-1,) + (1,) * (w.dim() - 1)
        new_w = (w.to(f64) * scale.reshape(shape)).to(w.dtype)
        new_b = ((b0 - stats["running_mean"].to(f64)) * scale + beta).to(w.dtype)
        if not _exact_on_special_values(bias0, stats, scale, new_w, new_b):
            return None
        consts = []
        for suffix, tensor in (("weight", new_w), ("bias", new_b)):
            name = f"_fold_bn.{bn.id}.{suffix}"
            graph.constants[name] = tensor
            t = TensorType(tuple(tensor.shape), tensor.dtype, w_val.type.device)
            v = Value(name, t, kind="const")
            graph.inputs.append(v)
            consts.append(v)
        return emit(producer.op, producer.inputs[0], consts[0], consts[1], **producer.attrs)

    return rewrite


def _exact_on_special_values(
    b: torch.Tensor | None,
    stats: dict[str, torch.Tensor | None],
    scale: torch.Tensor,
    new_w: torch.Tensor,
    new_b: torch.Tensor,
) -> bool:
    """Whether folding keeps eager's NaN and inf positions: every parameter, the scale and the
    folded parameters finite, the scale nonzero. NOTE: an inf or NaN parameter, a zero variance
    with eps 0 (scale inf), a zero gamma (scale 0: eager's ``inf * 0`` at an overflowed or
    non-finite conv output is NaN where the folded zero weight gives 0) or a folded weight that
    overflows the dtype would move NaNs and infinities: such a pair is not folded."""
    # NOTE: w itself is not read again: with the scale finite and nonzero, an inf or NaN in w
    # is one in new_w (w * scale keeps it), so new_w's check covers w's
    tensors = [scale, new_w, new_b] + [t for t in (b, *stats.values()) if t is not None]
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        return False
    return bool((scale != 0).all())


def _channels_match(m: Match) -> bool:
    # batch_norm normalizes dim 1: for linear that is the feature dim only on 2-D outputs
    producer = m["producer"]
    out = producer.outputs[0].type
    return producer.op == "conv2d" or out.rank == 2


@register_pass("fold-bn", CONTRACT, rules=("fold-bn.conv", "fold-bn.linear"))
def fold_bn(graph: Graph, ctx: PassContext) -> Graph:
    """conv2d/linear followed by inference batch_norm, all constant: one conv2d/linear with folded
    weight and bias (weight * gamma/sqrt(var+eps); (bias - mean) * gamma/sqrt(var+eps) + beta)."""
    rules = []
    for op in ("conv2d", "linear"):
        pattern = Op(
            "batch_norm",
            Op(op, Var("x"), Var("w"), Var("b"), name="producer", single_use=True),
            Var("gamma"),
            Var("beta"),
            Var("mean"),
            Var("var"),
        )
        rules.append(Rule(f"fold-bn.{op.replace('conv2d', 'conv')}", pattern, _fold(graph)))
    return apply_rules(graph, rules, ctx.record)
