"""Every op family, imported so that each registers its ops (and their derivative rules).

NOTE: the import order is the registry's order (:func:`plait.ir.ops.all_ops` iterates in it):
``torch_vjp`` first, then the extern families, the typed ATen calls (and the batch norms
fused with a ReLU), data-dependent ops, views, movement, pointwise, reductions and random ops.
"""

# isort: off
from plait.ir.ops import vjp  # noqa: F401  (registers torch_vjp)
from plait.ir.ops import linalg, pooling, extern  # noqa: F401
from plait.ir.ops import aten, aten_derivatives, batch_norm_relu, datadep  # noqa: F401
from plait.ir.ops import view, view_derivatives, movement  # noqa: F401
from plait.ir.ops import pointwise, unary_derivatives, binary_derivatives  # noqa: F401
from plait.ir.ops import reduction, reduction_derivatives, scan, rng  # noqa: F401
# isort: on
