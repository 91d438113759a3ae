"""The CUDA backend's choices for extern nodes, read from the IR alone (no GPU needed): a node
with no tensor inputs has no CUDA-specific call (planning it raised IndexError), and eager's
oneDNN gelu (gelu(+inf) = NaN) is the CPU's only: on CUDA eager's gelu(+inf) is +inf."""

from __future__ import annotations

import torch

from plait.codegen.cuda_extern import cuda_call
from plait.codegen.onednn_postops import eager_gelu_uses_onednn
from plait.ir import GraphBuilder, TensorType


def test_a_node_without_inputs_takes_the_generic_call() -> None:
    gb = GraphBuilder()
    full = gb.call("full", shape=(4, 4), value=1.0, dtype=torch.float32, device="cuda:0")
    gb.output(full)
    node = gb.build().nodes[0]
    assert not node.inputs
    assert cuda_call(node, {}, channels_last=False) is None


def test_onednn_gelu_is_assumed_on_the_cpu_only() -> None:
    gb = GraphBuilder()
    cpu = gb.input("x", TensorType((8, 8), torch.float32, "cpu"))
    cuda = gb.input("y", TensorType((8, 8), torch.float32, "cuda:0"))
    assert eager_gelu_uses_onednn(cpu) == torch.backends.mkldnn.is_available()
    assert not eager_gelu_uses_onednn(cuda)
