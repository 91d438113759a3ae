"""The fingerprint warm start reads torch.nn's global hook tables, not its flags: registering a
global full backward hook sets ``_global_is_full_backward_hook`` for good, and a fingerprint
refused every module in the process after the hook was removed (a warm start captured on every
call, and the module's documented example failed once any test had registered one)."""

from __future__ import annotations

import pytest
from torch import nn
from torch.nn.modules import module as nn_module

from plait.snapshots.fingerprint import Unpinnable
from plait.snapshots.modules import module_fingerprint


def test_a_removed_global_backward_hook_leaves_fingerprints_possible() -> None:
    flag = nn_module._global_is_full_backward_hook
    handle = nn_module.register_module_full_backward_hook(lambda m, gin, gout: None)
    try:
        with pytest.raises(Unpinnable, match="global"):
            module_fingerprint(nn.Linear(2, 3))
    finally:
        handle.remove()
    try:
        assert nn_module._global_is_full_backward_hook
        fp = module_fingerprint(nn.Linear(2, 3))
        assert fp[0]["attrs"]["in_features"] == ["int", "2"]
    finally:
        nn_module._global_is_full_backward_hook = flag
