"""Token-by-token decoding with a key/value cache: Hugging Face causal language models built from
configs with random weights (no download), plait against eager and torch.compile on the CPU.

Each repetition runs, per system, a prefill of ``--prompt`` tokens and then ``--steps`` decode
calls of one token each, passing back the ``DynamicCache`` the previous call returned (the way
``generate`` drives a model). Every system reads the same token ids (drawn once, not sampled from
the logits, so no system's rounding changes what the next call reads). The systems run in turn,
the order rotating each repetition. Reported per system: the median decode call (ms; every
decode call of every timed repetition), the median prefill, the first repetition's whole time
(capture and compile included), the ratio of decode calls to eager's, parity (each call's
logits against eager's under the numerical contract's model rule), and for plait the number of
specializations the decode loop settled on.

    python -m benchmarks.kv_decode --models gpt2,llama --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import plait
import plait.contract
from benchmarks.bench.config import reject_unknown


def _gpt2(quick: bool) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, width, heads = (2, 64, 2) if quick else (6, 512, 8)
    config = GPT2Config(
        vocab_size=8192, n_positions=512, n_layer=layers, n_embd=width, n_head=heads
    )
    return GPT2LMHeadModel(config)


def _llama(quick: bool) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, width, inner, heads = (2, 64, 128, 4) if quick else (6, 512, 1408, 8)
    config = LlamaConfig(
        vocab_size=8192,
        max_position_embeddings=512,
        num_hidden_layers=layers,
        hidden_size=width,
        intermediate_size=inner,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
    )
    return LlamaForCausalLM(config)


MODELS: dict[str, Callable[[bool], nn.Module]] = {"gpt2": _gpt2, "llama": _llama}
SYSTEMS = ("eager", "plait", "inductor")


def _system(kind: str, model: nn.Module) -> Callable[..., Any]:
    if kind == "eager":
        return model
    if kind == "plait":
        return plait.compile(model)
    return torch.compile(model, backend="inductor")


def _generate(fn: Callable[..., Any], tokens: torch.Tensor, prompt: int) -> dict[str, Any]:
    """Prefill, then one call per remaining token; the seconds and logits of every call."""
    seconds, logits = [], []
    start = time.perf_counter()
    out = fn(tokens[:, :prompt], use_cache=True)
    seconds.append(time.perf_counter() - start)
    logits.append(out.logits[:, -1])
    cache = out.past_key_values
    for k in range(prompt, tokens.shape[1]):
        start = time.perf_counter()
        out = fn(tokens[:, k : k + 1], past_key_values=cache, use_cache=True)
        seconds.append(time.perf_counter() - start)
        logits.append(out.logits[:, -1])
        cache = out.past_key_values
    return {"seconds": seconds, "logits": logits}


def run_model(name: str, kinds: list[str], args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model: Any = MODELS[name](args.quick).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (args.batch, args.prompt + args.steps), generator=g)
    fns = {k: _system(k, model) for k in kinds}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rep in range(args.repeats + 1):
            order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
            for k in order:
                runs[k].append(_generate(fns[k], tokens, args.prompt))
    tol = plait.contract.load().tolerance("model", torch.float32)
    reference = runs["eager"][0]["logits"]
    out: dict[str, Any] = {"systems": {}}
    for k in kinds:
        timed = runs[k][1:]
        decode = [s for r in timed for s in r["seconds"][1:]]
        worst = max(
            float(((a - b).abs() - tol.rtol * b.abs()).max())
            for r in runs[k]
            for a, b in zip(r["logits"], reference)
        )
        rec = {
            "decode_ms": statistics.median(decode) * 1e3,
            "prefill_ms": statistics.median(r["seconds"][0] for r in timed) * 1e3,
            "first_run_s": sum(runs[k][0]["seconds"]),
            "parity": worst <= tol.atol,
        }
        if k == "plait":
            compiled: Any = fns[k]
            rec["specializations"] = len(compiled.specializations)
        out["systems"][k] = rec
    eager_ms = out["systems"]["eager"]["decode_ms"]
    for rec in out["systems"].values():
        rec["decode_vs_eager"] = eager_ms / rec["decode_ms"]
    return out


def _table(results: dict[str, Any]) -> str:
    rows = [
        "| model | system | decode ms/token | vs eager | prefill ms | first run s | parity | "
        "specializations |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, res in results["models"].items():
        for kind, r in res["systems"].items():
            rows.append(
                f"| {name} | {kind} | {r['decode_ms']:.2f} | {r['decode_vs_eager']:.2f}x | "
                f"{r['prefill_ms']:.2f} | {r['first_run_s']:.2f} | "
                f"{'pass' if r['parity'] else 'FAIL'} | {r.get('specializations', '')} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed repetitions after the first")
    ap.add_argument("--quick", action="store_true", help="tiny configs (a smoke run)")
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    kinds = [s for s in args.systems.split(",") if s]
    reject_unknown(ap, "model", names, tuple(MODELS))
    reject_unknown(ap, "system", kinds, SYSTEMS)
    if "eager" not in kinds:
        ap.error("--systems must include eager (the reference of parity and ratios)")
    torch.set_num_threads(args.threads)
    order = ["eager", *(k for k in kinds if k != "eager")]
    results = {
        "threads": args.threads,
        "batch": args.batch,
        "prompt": args.prompt,
        "steps": args.steps,
        "models": {name: run_model(name, order, args) for name in names},
    }
    print(_table(results))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    failed = [
        f"{n}/{k}"
        for n, res in results["models"].items()
        for k, r in res["systems"].items()
        if not r["parity"]
    ]
    if failed:
        print(f"parity failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
