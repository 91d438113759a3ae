"""Fingerprint warm starts across processes with other hash seeds (``PYTHONHASHSEED``): a set
of strings iterates in an order the seed decides. The fingerprint describes a set in sorted
order and keeps its iteration order aside (plait.snapshots.set_order): a set the capture's code
never iterates (never reads by a name other than for a membership test) lets the snapshot hit
under any seed; one it iterates serves a snapshot only where it iterates in the capture's order,
else the warm start captures again. Every process compares its answer with eager on fresh random
inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MODELS = """
import torch
from torch import nn

SCALES = {"alpha": 1.0, "beta": 2.0, "gamma": 3.0, "delta": 4.0, "eps": 5.0, "zeta": 6.0}
ORDER = set(SCALES)


class Unread(nn.Module):
    NAMES = set(SCALES)  # NOTE: as transformers' class attributes: forward never reads it

    def __init__(self):
        super().__init__()
        self.skip = {"alpha", "beta", "gamma", "delta"}  # NOTE: as PreTrainedModel.post_init's

    def forward(self, x):
        return x.sigmoid() * 2


class Member(Unread):
    def forward(self, x):
        if "beta" in self.NAMES and "zeta" not in self.skip:
            return x.relu() * 3
        return x


class Iterates(Unread):
    def forward(self, x):
        return torch.stack([x * SCALES[k] for k in self.NAMES])


class IteratesGlobal(nn.Module):
    def forward(self, x):
        return torch.stack([x * SCALES[k] for k in ORDER])


class IteratesInAHelper(Unread):
    def forward(self, x):
        return weighted(self, x)


def weighted(m, x):
    return torch.cat([x * SCALES[k] for k in m.skip])


ORDERS = {
    "Unread": lambda m: list(m.NAMES),
    "Member": lambda m: list(m.NAMES),
    "Iterates": lambda m: list(m.NAMES),
    "IteratesGlobal": lambda m: list(ORDER),
    "IteratesInAHelper": lambda m: list(m.skip),
}
"""

HF_MODEL = """
from torch import nn
from transformers import BertConfig
from transformers.models.bert.modeling_bert import (
    BertEmbeddings, BertIntermediate, BertOutput, BertPreTrainedModel,
)


class TinyBert(BertPreTrainedModel):
    # NOTE: BertModel's own forward runs transformers' decorator wrappers (nested functions: no
    # snapshot); this one runs its blocks. post_init makes these lists sets of the instance.
    _no_split_modules = ["BertEmbeddings", "BertLayer", "BertIntermediate", "BertOutput"]

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        n = config.num_hidden_layers
        self.inter = nn.ModuleList(BertIntermediate(config) for _ in range(n))
        self.out = nn.ModuleList(BertOutput(config) for _ in range(n))
        self.post_init()

    def forward(self, input_ids):
        h = self.embeddings(input_ids=input_ids)
        for a, b in zip(self.inter, self.out):
            h = b(a(h), h)
        return h


def config():
    return BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        vocab_size=64, max_position_embeddings=32,
    )
"""

CHILD = """
import json, sys
import torch, plait
from plait.cache.key import canonical_json, text_digest
from plait.cache.snapshots import front_parts
from plait.frontend import InputAdapter
from tests.util import contract_tol
import set_order_models as models
import set_order_hf as hf

cache, seed = sys.argv[1], int(sys.argv[2])
gen = torch.Generator().manual_seed(seed)
out = {}


def check(name, model, x):
    compiled = plait.compile(
        model, backend="eager", options={"warm_start": "fingerprint", "cache": cache}
    )
    with torch.no_grad():
        got, expected = compiled(x), model(x)
    torch.testing.assert_close(got, expected, **contract_tol("matmul", torch.float32))
    return str(compiled.specializations[0].manifest.cache["capture"])


for name, order in models.ORDERS.items():
    model = getattr(models, name)()
    out[name] = [check(name, model, torch.randn(3, generator=gen)), order(model)]

torch.manual_seed(0)
tiny = hf.TinyBert(hf.config()).eval()
ids = torch.randint(0, 64, (1, 8), generator=gen)
out["TinyBert"] = [check("TinyBert", tiny, ids), list(tiny._no_split_modules)]

# NOTE: the stock model: its front key (the set attributes post_init makes included)
from transformers import BertModel
torch.manual_seed(0)
bert = BertModel(hf.config()).eval()
spec, leaves, _ = InputAdapter(bert).flatten((ids,), {})
key = text_digest(canonical_json(dict(front_parts(bert, spec, leaves, {"backend": "eager"}))))
out["BertModel"] = [key, list(bert._no_split_modules)]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_snapshots_across_hash_seeds(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "set_order_models.py").write_text(MODELS)
    (src / "set_order_hf.py").write_text(HF_MODEL)
    path = os.pathsep.join([str(src), *sys.path])
    runs = {}
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": path}
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(CHILD), str(tmp_path / "cache"), seed],
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        runs[seed] = json.loads(done.stdout.strip().splitlines()[-1])

    first = runs["1"]
    for name, (note, _) in first.items():
        if name != "BertModel":
            assert note.endswith("saved"), (name, note)
    for seed in ("2", "3"):
        run = runs[seed]
        # NOTE: sets the program never iterates: the snapshot hits whatever their order
        for name in ("Unread", "Member", "TinyBert"):
            assert run[name][0].startswith("snapshot"), (seed, name, run[name])
        # NOTE: a set the program iterates: a snapshot only in the order it was captured in
        for name in ("Iterates", "IteratesGlobal", "IteratesInAHelper"):
            note, order = run[name]
            if order == first[name][1]:
                assert note.startswith("snapshot"), (seed, name, note)
            else:
                assert note.startswith("captured"), (seed, name, note)
                assert "iterates in another order" in note, (seed, name, note)
        assert run["BertModel"][0] == first["BertModel"][0], (seed, "the front key differs")
    # NOTE: the seeds do reorder each set (else the test would not test it)
    for name in ("Unread", "Iterates", "IteratesGlobal", "IteratesInAHelper", "TinyBert"):
        assert any(runs[s][name][1] != first[name][1] for s in ("2", "3")), name
    assert any(runs[s]["BertModel"][1] != first["BertModel"][1] for s in ("2", "3"))
