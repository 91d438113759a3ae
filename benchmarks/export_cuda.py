"""Exported CUDA programs with their compiled Triton kernels: what an export costs and carries,
and what a load in a fresh process costs with and without trusting them.

Per case (torchvision ResNet-50, float32, batch 1; ViT-B/16, bfloat16, batch 8): the export's
seconds, the artifact's bytes and its carried kernel bytes; then, for a trusted and an untrusted
load, each in a fresh process on an empty Triton cache and an empty plait kernel cache: the
seconds of the CUDA context, of ``plait.load`` (and its phases) and of the first call, what
became of the native kernels, and Triton's compiles and cache hits in that process (its
compilation listener). Every first output is
compared with the exporting process's compiled output, bit for bit.

    python -m benchmarks.export_cuda --out DIR [--cases resnet50-fp32-b1,vit_b_16-bf16-b8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import plait
from benchmarks.cuda_suite import import_torchvision

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch, plait
from safetensors.torch import load_file, save_file
from triton import knobs
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # NOTE: as exported
events = []
knobs.compilation.listener = lambda **kw: events.append(kw["cache_hit"])
t_cuda = time.perf_counter()
torch.empty(1, device="cuda")  # NOTE: the CUDA context, timed apart from the load
t1 = time.perf_counter()
loaded = plait.load(sys.argv[1], trust=sys.argv[4] or None)
t2 = time.perf_counter()
x = load_file(sys.argv[2])["x"].cuda()
y = loaded(x)
torch.cuda.synchronize()
t3 = time.perf_counter()
save_file({"y": y.float().cpu()}, sys.argv[3])
timings = {k: round(v, 3) for k, v in loaded.builds[0].manifest.timings.items()
           if not k.startswith("stax.kernel.")}
print(json.dumps({"import_s": t_cuda - t0, "cuda_init_s": t1 - t_cuda, "load_s": t2 - t1,
                  "first_call_s": t3 - t2, "timings": timings,
                  "native": loaded.native, "triton_compiles": events.count(False),
                  "triton_cache_hits": events.count(True)}))
"""


def _case(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    import_torchvision()
    import torchvision.models

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "resnet50-fp32-b1":
        return torchvision.models.resnet50().eval().cuda(), torch.randn(1, 3, 224, 224, generator=g)
    if name == "vit_b_16-bf16-b8":
        model = torchvision.models.vit_b_16().eval().cuda().to(torch.bfloat16)
        return model, torch.randn(8, 3, 224, 224, generator=g).to(torch.bfloat16)
    raise SystemExit(f"unknown case {name!r} (resnet50-fp32-b1, vit_b_16-bf16-b8)")


def _load(workdir: Path, path: Path, trust: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": tempfile.mkdtemp(dir=workdir),
        "PLAIT_CACHE_DIR": tempfile.mkdtemp(dir=workdir),
    }
    out = workdir / f"y-{'trusted' if trust else 'untrusted'}.safetensors"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(workdir / "x.safetensors"), str(out), trust],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    record: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    record["process_s"] = time.perf_counter() - start
    record["output"] = str(out)
    return record


def run_case(name: str, workdir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file, save_file

    model, x = _case(name)
    with torch.no_grad():
        start = time.perf_counter()
        artifact = plait.export(model, (x.cuda(),))
        export_s = time.perf_counter() - start
        want = plait.compile(model)(x.cuda()).float().cpu()
    path = artifact.save(workdir / f"{name}.plait")
    save_file({"x": x}, workdir / "x.safetensors")
    native = sum(len(v) for k, v in artifact.members.items() if k.startswith("native/"))
    record: dict[str, Any] = {
        "export_s": export_s,
        "artifact_bytes": path.stat().st_size,
        "native_bytes": native,
        "native_note": artifact.header["native_note"],
        "digest": artifact.digest,
    }
    for label, trust in (("trusted", artifact.digest), ("untrusted", "")):
        got = _load(workdir, path, trust)
        if "output" in got:
            got["bitwise_equal"] = torch.equal(load_file(got.pop("output"))["y"], want)
        record[label] = got
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="resnet50-fp32-b1,vit_b_16-bf16-b8")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ns.cases.split(","):
            results[name] = run_case(name, Path(tmp))
            print(name, json.dumps(results[name], indent=1), flush=True)
    print("| case | export s | artifact MB (kernels MB) | load | load s | first call s | "
          "Triton compiles / hits | bit-equal |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        for label in ("trusted", "untrusted"):
            g = r[label]
            if "error" in g:
                print(f"| {name} | | | {label} | error | | | |")
                continue
            print(
                f"| {name} | {r['export_s']:.1f} | {r['artifact_bytes'] / 1e6:.1f} "
                f"({r['native_bytes'] / 1e6:.1f}) | {label} ({g['native']['status']}) | "
                f"{g['load_s']:.2f} | {g['first_call_s']:.2f} | "
                f"{g['triton_compiles']} / {g['triton_cache_hits']} | {g['bitwise_equal']} |"
            )
    if ns.out is not None:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "export_cuda.json").write_text(json.dumps(results, indent=1))
    ok = all("error" not in r[k] and r[k]["bitwise_equal"] for r in results.values()
             for k in ("trusted", "untrusted"))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
