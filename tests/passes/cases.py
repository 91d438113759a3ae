"""For every rewrite rule: a graph where it must fire and one where it must not.

Each case is (IR text, pipeline, whether params are frozen). The completeness test walks every
registered pass and rule and requires a case here, so no rule can exist without being shown to
reach the manifest.
"""

from __future__ import annotations

HEAD = "graph(\n  user %x: f32[4, 6]\n) {\n"


def g(body: str, head: str = HEAD) -> str:
    return head + body + "\n}"


BN_HEAD = """graph(
  user %x: f32[2, 3, 8, 8]
  param %w: f32[4, 3, 3, 3]
  param %g: f32[4]
  param %b: f32[4]
  buffer %m: f32[4]
  buffer %v: f32[4]
) {
"""
LIN_HEAD = """graph(
  user %x: f32[5, 3]
  param %w: f32[4, 3]
  param %lb: f32[4]
  param %g: f32[4]
  param %b: f32[4]
  buffer %m: f32[4]
  buffer %v: f32[4]
) {
"""

# NOTE: ATen's training batch norm and its backward, as a training program's halves hold them
BN_TRAIN_HEAD = """graph(
  user %x: f32[4, 3, 5, 5]
  param %w: f32[3]
  param %b: f32[3]
  buffer %m: f32[3]
  buffer %v: f32[3]
) {
"""
BN_TRAIN = (
    '  %0, %1, %2, %3, %4 = aten(%x, %w, %b, %m, %v) {name="_native_batch_norm_legit_functional", '
    'literals="[{\\"t\\": 0}, {\\"t\\": 1}, {\\"t\\": 2}, {\\"t\\": 3}, {\\"t\\": 4}, '
    'true, 0.1, 1e-05]"} : f32[4, 3, 5, 5], f32[3], f32[3], f32[3], f32[3]\n'
    "  %5 = relu(%0) : f32[4, 3, 5, 5]\n"
)
BN_BACKWARD_HEAD = """graph(
  user %g: f32[4, 3, 5, 5]
  user %x: f32[4, 3, 5, 5]
  param %w: f32[3]
  user %mean: f32[3]
  user %rstd: f32[3]
  user %y: f32[4, 3, 5, 5]
) {
"""
BN_BACKWARD = (
    "  %0 = le(%y, 0) : bool[4, 3, 5, 5]\n"
    "  %1 = where(%0, 0.0, %g) : f32[4, 3, 5, 5]\n"
    '  %2, %3, %4 = aten(%1, %x, %w, %mean, %rstd) {name="native_batch_norm_backward", '
    'literals="[{\\"t\\": 0}, {\\"t\\": 1}, {\\"t\\": 2}, null, null, {\\"t\\": 3}, '
    '{\\"t\\": 4}, true, 1e-05, [true, true, true]]"} : f32[4, 3, 5, 5], f32[3], f32[3]\n'
)

# the shape-prop case starts from a graph whose input type changed after it was built
UNVERIFIED = {"shape-prop.retype"}
# NOTE: cases typed for a CUDA device, which the reference interpreter on the CPU refuses; their
# meaning is judged in tests/codegen/test_cuda_pad_products.py
CUDA_TYPED = {"pad-products.operands"}

# rule -> (graph where it fires, pipeline, freeze?)
# NOTE: a vocabulary head's two gradient products on CUDA in bfloat16 (V = 1001)
HEAD_GRAD_HEAD = """graph(
  user %dy: bf16[16, 1001]@cuda:0
  user %w: bf16[1001, 64]@cuda:0
  user %x: bf16[16, 64]@cuda:0
) {
"""
HEAD_GRAD = (
    "  %0 = matmul(%dy, %w) : bf16[16, 64]@cuda:0\n"
    "  %1 = permute(%dy) {dims=[1, 0]} : bf16[1001, 16]@cuda:0\n"
    "  %2 = matmul(%1, %x) : bf16[1001, 64]@cuda:0\n"
)

FIRES: dict[str, tuple[str, str, bool]] = {
    "dce.dead-node": (g("  %0 = exp(%x) : f32[4, 6]\n  return %x"), "dce", False),
    "dce.unused-const": (
        g(
            "  %0 = exp(%x) : f32[4, 6]\n  return %x",
            "graph(\n  user %x: f32[4, 6]\n  param %p: f32[4, 6]\n) {\n",
        ),
        "freeze,dce",
        True,
    ),
    "cse.duplicate": (
        g(
            "  %0 = exp(%x) : f32[4, 6]\n  %1 = exp(%x) : f32[4, 6]\n"
            "  %2 = add(%0, %1) : f32[4, 6]\n  return %2"
        ),
        "cse",
        False,
    ),
    "canonicalize.view-to-reshape": (
        g("  %0 = view(%x) {shape=[24]} : f32[24]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.flatten-to-reshape": (
        g("  %0 = flatten(%x) : f32[24]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.squeeze-to-reshape": (
        g(
            "  %0 = unsqueeze(%x) {dim=0} : f32[1, 4, 6]\n  %1 = squeeze(%0) : f32[4, 6]\n"
            "  %2 = relu(%1) : f32[4, 6]\n  return %2"
        ),
        "canonicalize",
        False,
    ),
    "canonicalize.unsqueeze-to-reshape": (
        g("  %0 = unsqueeze(%x) {dim=1} : f32[4, 1, 6]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.transpose-to-permute": (
        g("  %0 = transpose(%x) {dim0=0, dim1=1} : f32[6, 4]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.drop-contiguous": (
        g("  %0 = contiguous(%x) : f32[4, 6]\n  %1 = exp(%0) : f32[4, 6]\n  return %1"),
        "canonicalize",
        False,
    ),
    "canonicalize.normalize-dims": (
        g("  %0 = softmax(%x) {dim=-1} : f32[4, 6]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.pool-stride-default": (
        g(
            "  %0 = max_pool2d(%x) {kernel_size=[2, 2]} : f32[1, 2, 3, 3]\n  return %0",
            "graph(\n  user %x: f32[1, 2, 6, 6]\n) {\n",
        ),
        "canonicalize",
        False,
    ),
    "simplify.mul-one": (
        g("  %0 = mul(%x, 1) : f32[4, 6]\n  %1 = exp(%0) : f32[4, 6]\n  return %1"),
        "simplify",
        False,
    ),
    "simplify.one-mul": (g("  %0 = mul(1.0, %x) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.add-zero": (g("  %0 = add(%x, -0.0) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.zero-add": (g("  %0 = add(-0.0, %x) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.sub-zero": (g("  %0 = sub(%x, 0.0) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.div-one": (g("  %0 = div(%x, 1) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.pow-one": (g("  %0 = pow(%x, 1.0) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.double-neg": (
        g("  %0 = neg(%x) : f32[4, 6]\n  %1 = neg(%0) : f32[4, 6]\n  return %1"),
        "simplify",
        False,
    ),
    "simplify.double-not": (
        g(
            "  %0 = logical_not(%x) : bool[4, 6]\n  %1 = logical_not(%0) : bool[4, 6]\n  return %1",
            "graph(\n  user %x: bool[4, 6]\n) {\n",
        ),
        "simplify",
        False,
    ),
    "simplify.cast-same-dtype": (
        g("  %0 = to_dtype(%x) {dtype=f32} : f32[4, 6]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.cast-round-trip": (
        g(
            "  %0 = to_dtype(%x) {dtype=f64} : f64[4, 6]\n  %1 = to_dtype(%0) {dtype=f32} : "
            "f32[4, 6]\n  return %1"
        ),
        "simplify",
        False,
    ),
    "simplify.dropout-eval": (
        g("  %0 = dropout(%x) {train=false} : f32[4, 6]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.identity-view": (
        g("  %0 = reshape(%x) {shape=[4, 6]} : f32[4, 6]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.zero-pad": (
        g(
            "  %0 = constant_pad(%x) {pad=[0, 0, 0, 0], value=0.0} : f32[4, 6]\n"
            "  %1 = exp(%0) : f32[4, 6]\n  return %1"
        ),
        "simplify",
        False,
    ),
    "simplify.identity-permute": (
        g("  %0 = permute(%x) {dims=[0, 1]} : f32[4, 6]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.permute-permute": (
        g(
            "  %0 = permute(%x) {dims=[1, 0]} : f32[6, 4]\n  %1 = permute(%0) {dims=[1, 0]} : "
            "f32[4, 6]\n  %2 = exp(%1) : f32[4, 6]\n  return %2"
        ),
        "simplify",
        False,
    ),
    "simplify.reshape-chain": (
        g(
            "  %0 = reshape(%x) {shape=[24]} : f32[24]\n  %1 = reshape(%0) {shape=[2, 12]} : "
            "f32[2, 12]\n  return %1"
        ),
        "simplify",
        False,
    ),
    "freeze.param": (
        g(
            "  %0 = mul(%x, %p) : f32[4, 6]\n  return %0",
            "graph(\n  user %x: f32[4, 6]\n  param %p: f32[4, 6]\n) {\n",
        ),
        "freeze",
        True,
    ),
    "const-fold.node": (
        g(
            "  %0 = transpose(%p) {dim0=0, dim1=1} : f32[6, 4]\n"
            "  %1 = matmul(%x, %0) : f32[4, 4]\n  return %1",
            "graph(\n  user %x: f32[4, 6]\n  param %p: f32[4, 6]\n) {\n",
        ),
        "freeze,const-fold",
        True,
    ),
    "fold-bn.conv": (
        g(
            "  %0 = conv2d(%x, %w, none) {padding=[1, 1]} : f32[2, 4, 8, 8]\n"
            "  %1 = batch_norm(%0, %g, %b, %m, %v) : f32[2, 4, 8, 8]\n  return %1",
            BN_HEAD,
        ),
        "freeze,fold-bn",
        True,
    ),
    "fold-bn.linear": (
        g(
            "  %0 = linear(%x, %w, %lb) : f32[5, 4]\n"
            "  %1 = batch_norm(%0, %g, %b, %m, %v) : f32[5, 4]\n  return %1",
            LIN_HEAD,
        ),
        "freeze,fold-bn",
        True,
    ),
    "decompose.gelu": (
        g('  %0 = gelu(%x) {approximate="tanh"} : f32[4, 6]\n  return %0'),
        "decompose",
        False,
    ),
    "decompose.silu": (g("  %0 = silu(%x) : f32[4, 6]\n  return %0"), "decompose", False),
    "decompose.softmax": (
        g("  %0 = softmax(%x) {dim=1} : f32[4, 6]\n  return %0"),
        "decompose",
        False,
    ),
    "decompose.log_softmax": (
        g("  %0 = log_softmax(%x) {dim=0} : f32[4, 6]\n  return %0"),
        "decompose",
        False,
    ),
    "decompose.layer_norm": (
        g(
            "  %0 = layer_norm(%x, %w, none) {normalized_shape=[6]} : bf16[4, 6]\n  return %0",
            "graph(\n  user %x: bf16[4, 6]\n  param %w: bf16[6]\n) {\n",
        ),
        "decompose",
        False,
    ),
    "decompose.batch_norm": (
        g(
            "  %0 = batch_norm(%x, %g, %b, %m, %v) : f32[2, 3, 8, 8]\n  return %0",
            BN_HEAD.replace("f32[4]", "f32[3]"),
        ),
        "decompose",
        False,
    ),
    "decompose.batch_norm_train": (
        g(
            "  %0, %1, %2 = batch_norm_train(%x, %g, %b, %m, %v) : f32[2, 3, 8, 8], f32[3], "
            "f32[3]\n  return %0, %1, %2",
            BN_HEAD.replace("f32[4]", "f32[3]"),
        ),
        "decompose",
        False,
    ),
    "decompose.group_norm": (
        g(
            "  %0 = group_norm(%x, none, none) {num_groups=2} : f32[2, 4, 3]\n  return %0",
            "graph(\n  user %x: f32[2, 4, 3]\n) {\n",
        ),
        "decompose",
        False,
    ),
    "shape-prop.retype": (
        g("  %0 = exp(%x) : f32[4, 6]\n  return %0", "graph(\n  user %x: f32[4, (s0)]\n) {\n"),
        "shape-prop",
        False,
    ),
    "fuse-bn-relu.forward": (
        g(BN_TRAIN + "  return %5, %1, %2, %3, %4", BN_TRAIN_HEAD),
        "fuse-bn-relu",
        False,
    ),
    "fuse-bn-relu.backward": (
        g(BN_BACKWARD + "  return %2, %3, %4", BN_BACKWARD_HEAD),
        "fuse-bn-relu",
        False,
    ),
    "pad-products.operands": (
        g(
            HEAD_GRAD + "  %3 = mul(%2, 2.0) : bf16[1001, 64]@cuda:0\n  return %0, %3",
            HEAD_GRAD_HEAD,
        ),
        "pad-products",
        False,
    ),
}

# rule -> (graph where it must not fire, pipeline, freeze?)
MUST_NOT: dict[str, tuple[str, str, bool]] = {
    "dce.dead-node": (
        g("  %0 = dropout(%x) : f32[4, 6]\n  %1 = dropout(%x) : f32[4, 6]\n  return %1"),
        "dce",
        False,
    ),
    "dce.unused-const": (
        g(
            "  %0 = mul(%x, %p) : f32[4, 6]\n  return %0",
            "graph(\n  user %x: f32[4, 6]\n  param %p: f32[4, 6]\n) {\n",
        ),
        "freeze,dce",
        True,
    ),
    "cse.duplicate": (
        g(
            "  %0 = dropout(%x) : f32[4, 6]\n  %1 = dropout(%x) : f32[4, 6]\n"
            "  %2 = add(%0, %1) : f32[4, 6]\n  return %2"
        ),
        "cse",
        False,
    ),
    "canonicalize.view-to-reshape": (
        g("  %0 = reshape(%x) {shape=[24]} : f32[24]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.flatten-to-reshape": (
        g("  %0 = exp(%x) : f32[4, 6]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.squeeze-to-reshape": (
        g("  %0 = exp(%x) : f32[4, 6]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.unsqueeze-to-reshape": (
        g("  %0 = exp(%x) : f32[4, 6]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.transpose-to-permute": (
        g("  %0 = permute(%x) {dims=[1, 0]} : f32[6, 4]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.drop-contiguous": (
        g("  %0 = exp(%x) : f32[4, 6]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.normalize-dims": (
        g("  %0 = softmax(%x) {dim=1} : f32[4, 6]\n  return %0"),
        "canonicalize",
        False,
    ),
    "canonicalize.pool-stride-default": (
        g(
            "  %0 = max_pool2d(%x) {kernel_size=[2, 2], stride=[1, 1]} : f32[1, 2, 5, 5]\n"
            "  return %0",
            "graph(\n  user %x: f32[1, 2, 6, 6]\n) {\n",
        ),
        "canonicalize",
        False,
    ),
    "simplify.mul-one": (g("  %0 = mul(%x, 2) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.one-mul": (  # int tensor * 1.0 is a float tensor: the types differ, no rewrite
        g("  %0 = mul(1.0, %x) : f32[4, 6]\n  return %0", "graph(\n  user %x: i64[4, 6]\n) {\n"),
        "simplify",
        False,
    ),
    # NOTE: -0.0 + 0.0 is +0.0, -0.0 - (-0.0) is +0.0: the identities do not hold for these zeros
    "simplify.add-zero": (g("  %0 = add(%x, 0.0) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.zero-add": (g("  %0 = add(0, %x) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.sub-zero": (g("  %0 = sub(%x, -0.0) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.div-one": (
        g('  %0 = div(%x, 1) {rounding_mode="floor"} : f32[4, 6]\n  return %0'),
        "simplify",
        False,
    ),
    "simplify.pow-one": (g("  %0 = pow(1.0, %x) : f32[4, 6]\n  return %0"), "simplify", False),
    "simplify.double-neg": (
        g("  %0 = neg(%x) : f32[4, 6]\n  %1 = abs(%0) : f32[4, 6]\n  return %1"),
        "simplify",
        False,
    ),
    "simplify.double-not": (
        g(
            "  %0 = logical_not(%x) : bool[4, 6]\n  return %0",
            "graph(\n  user %x: bool[4, 6]\n) {\n",
        ),
        "simplify",
        False,
    ),
    "simplify.cast-same-dtype": (
        g("  %0 = to_dtype(%x) {dtype=f64} : f64[4, 6]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.cast-round-trip": (  # f32 -> bf16 -> f32 loses bits: must stay
        g(
            "  %0 = to_dtype(%x) {dtype=bf16} : bf16[4, 6]\n  %1 = to_dtype(%0) {dtype=f32} : "
            "f32[4, 6]\n  return %1"
        ),
        "simplify",
        False,
    ),
    "simplify.dropout-eval": (
        g("  %0 = dropout(%x) {p=0.1} : f32[4, 6]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.identity-view": (
        g("  %0 = reshape(%x) {shape=[6, 4]} : f32[6, 4]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.zero-pad": (
        g("  %0 = constant_pad(%x) {pad=[0, 1, 0, 0], value=0.0} : f32[4, 7]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.identity-permute": (
        g("  %0 = permute(%x) {dims=[1, 0]} : f32[6, 4]\n  return %0"),
        "simplify",
        False,
    ),
    "simplify.permute-permute": (
        g("  %0 = permute(%x) {dims=[1, 0]} : f32[6, 4]\n  %1 = exp(%0) : f32[6, 4]\n  return %1"),
        "simplify",
        False,
    ),
    "simplify.reshape-chain": (
        g("  %0 = reshape(%x) {shape=[24]} : f32[24]\n  %1 = exp(%0) : f32[24]\n  return %1"),
        "simplify",
        False,
    ),
    "freeze.param": (
        g(
            "  %0 = mul(%x, %p) : f32[4, 6]\n  return %0",
            "graph(\n  user %x: f32[4, 6]\n  param %p: f32[4, 6]\n) {\n",
        ),
        "freeze",
        False,
    ),
    "const-fold.node": (
        g(
            "  %0 = transpose(%p) {dim0=0, dim1=1} : f32[6, 4]\n"
            "  %1 = matmul(%x, %0) : f32[4, 4]\n  return %1",
            "graph(\n  user %x: f32[4, 6]\n  param %p: f32[4, 6]\n) {\n",
        ),
        "const-fold",
        False,
    ),
    # the conv output has a second user: folding would need the unnormalized conv too
    "fold-bn.conv": (
        g(
            "  %0 = conv2d(%x, %w, none) {padding=[1, 1]} : f32[2, 4, 8, 8]\n"
            "  %1 = batch_norm(%0, %g, %b, %m, %v) : f32[2, 4, 8, 8]\n"
            "  %2 = add(%1, %0) : f32[2, 4, 8, 8]\n  return %2",
            BN_HEAD,
        ),
        "freeze,fold-bn",
        True,
    ),
    "fold-bn.linear": (
        g(
            "  %0 = linear(%x, %w, %lb) : f32[5, 4]\n"  # not frozen: training
            "  %1 = batch_norm(%0, %g, %b, %m, %v) : f32[5, 4]\n  return %1",
            LIN_HEAD,
        ),
        "fold-bn",
        False,
    ),
    "decompose.gelu": (g("  %0 = relu(%x) : f32[4, 6]\n  return %0"), "decompose", False),
    "decompose.silu": (g("  %0 = relu(%x) : f32[4, 6]\n  return %0"), "decompose", False),
    "decompose.softmax": (
        g(
            "  %0 = softmax(%x) {dim=1} : f32[0, 6]\n  return %0",
            "graph(\n  user %x: f32[0, 6]\n) {\n",
        ),
        "decompose",
        False,
    ),
    "decompose.log_softmax": (g("  %0 = relu(%x) : f32[4, 6]\n  return %0"), "decompose", False),
    "decompose.layer_norm": (g("  %0 = relu(%x) : f32[4, 6]\n  return %0"), "decompose", False),
    "decompose.batch_norm": (g("  %0 = relu(%x) : f32[4, 6]\n  return %0"), "decompose", False),
    "decompose.batch_norm_train": (  # one value per channel: the unbiased variance is undefined
        g(
            "  %0, %1, %2 = batch_norm_train(%x, none, none, %m, %v) : f32[1, 4], f32[4], "
            "f32[4]\n  return %0, %1, %2",
            "graph(\n  user %x: f32[1, 4]\n  buffer %m: f32[4]\n  buffer %v: f32[4]\n) {\n",
        ),
        "decompose",
        False,
    ),
    "decompose.group_norm": (g("  %0 = relu(%x) : f32[4, 6]\n  return %0"), "decompose", False),
    "shape-prop.retype": (g("  %0 = exp(%x) : f32[4, 6]\n  return %0"), "shape-prop", False),
    # NOTE: the normalized result has another reader; the masked gradient is returned too
    "fuse-bn-relu.forward": (
        g(
            BN_TRAIN + "  %6 = add(%5, %0) : f32[4, 3, 5, 5]\n  return %6, %1, %2, %3, %4",
            BN_TRAIN_HEAD,
        ),
        "fuse-bn-relu",
        False,
    ),
    "fuse-bn-relu.backward": (
        g(BN_BACKWARD + "  return %2, %3, %4, %1", BN_BACKWARD_HEAD),
        "fuse-bn-relu",
        False,
    ),
    # NOTE: float32 products are never padded (cuBLAS aligns nothing for them)
    "pad-products.operands": (
        g(
            "  %0 = matmul(%x, %w) : f32[4, 5]@cuda:0\n  return %0",
            "graph(\n  user %x: f32[4, 7]@cuda:0\n  user %w: f32[7, 5]@cuda:0\n) {\n",
        ),
        "pad-products",
        False,
    ),
}
