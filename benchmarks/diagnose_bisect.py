"""How long ``plait.diagnose.bisect`` takes on large graphs, with seeded miscompiles.

ResNet-50 (224x224, batch 1) and a GPT-2-sized model (12 layers, d_model 768, the GPT-2 vocabulary,
64 tokens), each with a wrong rewrite rule in a user's pass run last in the pipeline (every
changed pass is judged: the slow case) and with a wrong native kernel (the backend case).
Prints one JSON line per run: the model, the seeded bug, the captured graph's size, what was
found, the repro's size and the seconds per phase.

    PYTHONPATH=src:. python benchmarks/diagnose_bisect.py [resnet50|gpt2 ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

import plait.diagnose
from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.resnet import resnet50
from plait.codegen import scalar
from plait.passes import CONTRACT, INFERENCE_PIPELINE, all_passes, register_pass
from plait.passes.rewrite import Op, Rule, Var, apply_rules


def _wrong_rule(op: str, make: Callable[[Any, Any], Any]) -> str:
    """A user's pass with one wrong rule on ``op`` (registered once)."""
    name = f"wrong-{op}"
    if name not in all_passes():

        @register_pass(name, CONTRACT, rules=(f"{name}.rule",))
        def wrong(graph: Any, ctx: Any) -> Any:
            return apply_rules(graph, [Rule(f"{name}.rule", Op(op, Var("x")), make)], ctx.record)

    return name


@contextmanager
def _wrong_kernel(op: str) -> Iterator[None]:
    """The native kernel of ``op`` computes its negation."""
    original = scalar.RULES[op]

    def wrong(b: Any, node: Any, args: Any, idx: Any) -> Any:
        out = original(b, node, args, idx)
        return b.op("neg", [out], scalar.out_type(node))

    scalar.RULES[op] = wrong
    try:
        yield
    finally:
        scalar.RULES[op] = original


Case = tuple[Callable[[], torch.nn.Module], Callable[[], tuple[Any, ...]], str]


def _models() -> dict[str, Case]:
    gpt2 = GPT2Config(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, d_model=768)
    return {
        "resnet50": (lambda: resnet50(), lambda: (torch.randn(1, 3, 224, 224),), "relu"),
        "gpt2": (lambda: GPT2(gpt2), lambda: (torch.randint(0, 50257, (1, 64)),), "gelu"),
    }


def run(name: str, bug: str) -> dict[str, Any]:
    build, inputs, op = _models()[name]
    torch.manual_seed(0)
    model = build().eval()
    args = inputs()
    nodes = len(plait.capture(model, args).graph.nodes)  # type: ignore[union-attr]
    options: dict[str, Any] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        if bug == "pass":
            leaky = _wrong_rule(op, lambda m, emit: emit("mul", m["x"], 0.5))
            options["passes"] = f"{INFERENCE_PIPELINE},{leaky}"
            result = plait.diagnose.bisect(model, args, options=options, repro_dir=d)
        else:
            with _wrong_kernel(op):
                result = plait.diagnose.bisect(model, args, repro_dir=d)
        repro_nodes = plait.diagnose.rerun(result.repro).nodes if result.repro else None
    return {
        "model": name,
        "bug": bug,
        "captured_nodes": nodes,
        "stage": result.stage,
        "pass": result.pass_name,
        "node": result.node.text if result.node else None,
        "rule": result.rule,
        "repro_nodes": repro_nodes,
        "seconds": round(time.perf_counter() - start, 2),
        "phases": {k: round(v, 2) for k, v in result.seconds.items()},
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    warnings.simplefilter("ignore")
    for name in sys.argv[1:] or ["resnet50", "gpt2"]:
        for bug in ("pass", "backend"):
            print(json.dumps(run(name, bug)), flush=True)


if __name__ == "__main__":
    main()
