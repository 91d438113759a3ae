"""torchvision's model definitions on a machine whose PyPI torchvision cannot be imported.

On the CPU machines the PyPI torchvision matching torch 2.13.0+cpu is a CUDA build whose native
extension fails to load there (``operator torchvision::nms does not exist``), and timm imports
torchvision. The classifiers the zoo measures (ResNet, MobileNetV3, EfficientNet, ConvNeXt, ViT)
are pure Python over ``torch``: they never call torchvision's native operators. So ``fetch``
takes the pinned torchvision wheel (``constraints.txt``), keeps only its Python files (no shared
library of the mismatched build is ever loaded), and :func:`use_torchvision` makes
``import torchvision.models`` (and timm) work from that tree, with a ``torchvision`` package whose
``__init__`` (which loads the extension and registers its operators' meta kernels) is not run.
A model that calls one of torchvision's native operators (``nms``, ``roi_align``) then fails
loudly: ``torch.ops.torchvision`` has no such operator.

Where ``import torchvision`` works (the GPU machine), that torchvision is used and this module does
nothing.

Example:
    >>> use_torchvision() in ("installed", "python-only", None)
    True
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
# NOTE: beside the virtual environment that runs the benchmarks (never inside the repository)
TREE = Path(os.environ.get("PLAIT_TORCHVISION_PY", Path(sys.prefix) / "share" / "torchvision-py"))
IMPORT_CHECK_TIMEOUT_S = 120.0


def pinned(package: str) -> str:
    """The version ``constraints.txt`` pins ``package`` to."""
    for line in CONSTRAINTS.read_text().splitlines():
        m = re.fullmatch(rf"{re.escape(package)}==(\S+)", line.strip())
        if m:
            return m.group(1)
    raise LookupError(f"constraints.txt pins no version of {package}")


def fetch(tree: Path = TREE) -> Path:
    """Download the pinned torchvision wheel (no dependencies) and keep its Python files in
    ``tree``; returns ``tree``. Nothing is installed into the environment."""
    version = pinned("torchvision")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "-d", tmp, f"torchvision=={version}"],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("torchvision-*.whl")
        tree.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="torchvision-py-", dir=tree.parent))
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith("torchvision/") and name.endswith(".py"):
                    zf.extract(name, staging)
        (staging / "VERSION").write_text(version + "\n")
    if tree.exists():
        _remove(tree)
    staging.rename(tree)
    return tree


def _remove(tree: Path) -> None:
    for p in sorted(tree.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    tree.rmdir()


def _imports_normally() -> bool:
    """Whether ``import torchvision`` works, tried in a child process: a broken build must not
    leave half-registered operators in this one."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import torchvision"],
            capture_output=True,
            timeout=IMPORT_CHECK_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


_MODE: list[str | None] = []


def use_torchvision(tree: Path = TREE) -> str | None:
    """Make ``import torchvision.models`` work: ``"installed"`` (the installed torchvision
    imports), ``"python-only"`` (from ``tree``, which ``fetch`` made) or None (neither)."""
    if _MODE:
        return _MODE[0]
    mode: str | None = None
    if "torchvision" in sys.modules or _imports_normally():
        mode = "installed"
    elif (tree / "torchvision" / "models" / "__init__.py").is_file():
        package = tree / "torchvision"
        module = types.ModuleType("torchvision")
        module.__path__ = [str(package)]
        module.__file__ = str(package / "__init__.py")
        spec = importlib.machinery.ModuleSpec("torchvision", None, is_package=True)
        spec.submodule_search_locations = [str(package)]
        module.__spec__ = spec
        module.__version__ = (tree / "VERSION").read_text().strip()  # type: ignore[attr-defined]
        sys.modules["torchvision"] = module
        mode = "python-only"
    _MODE.append(mode)
    return mode


def main(argv: list[str]) -> int:
    if argv != ["fetch"]:
        print("usage: python -m benchmarks.model_sources fetch", file=sys.stderr)
        return 2
    print(f"torchvision's model definitions (Python files only) in {fetch()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
