"""The export package never unpickles and never evaluates text: no pickle-family module, no
``torch.load``, ``eval``, ``exec``, ``compile`` or dynamic import anywhere in it (tensors come
from safetensors' own reader, programs from the IR's parser)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import plait.export

SOURCES = sorted(Path(plait.export.__file__).parent.glob("*.py"))
MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib", "importlib"}
CALLS = {"eval", "exec", "compile", "__import__", "load"}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_unpickling_or_evaluation(source: Path) -> None:
    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not {a.name.split(".")[0] for a in node.names} & MODULES, source.name
        if isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] not in MODULES, source.name
        if isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name):
                assert fn.id not in CALLS - {"load"}, f"{source.name}:{node.lineno} {fn.id}"
            if isinstance(fn, ast.Attribute) and fn.attr == "load":
                owner = ast.unparse(fn.value)
                assert owner not in ("torch", "pickle", "marshal"), f"{source.name}:{node.lineno}"
