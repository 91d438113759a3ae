"""L2 passes: the PassManager, the rewrite driver and the core passes.

Pipelines are text or lists of registered pass names; every pass returns a record of what it did.

Example:
    >>> from plait.passes import all_passes, parse_pipeline
    >>> parse_pipeline("cse,dce,fold-bn")
    ['cse', 'dce', 'fold-bn']
    >>> sorted(all_passes())[:3]
    ['canonicalize', 'const-fold', 'cse']
"""

from plait.passes import (  # noqa: F401
    canonicalize,
    cleanup,
    decompose,
    fold,
    fold_bn,
    fuse_bn_relu,
    pad_products,
    shapes,
    simplify,
)
from plait.passes.manager import (
    CONTRACT,
    EXACT,
    VALUE_EQUAL,
    PassContext,
    PassInfo,
    PassRecord,
    PipelineResult,
    RewriteRecord,
    all_passes,
    get_pass,
    parse_pipeline,
    register_pass,
    run_pipeline,
)

# The default pipelines. NOTE: inference freezes and folds; training keeps parameters as inputs.
INFERENCE_PIPELINE = "canonicalize,simplify,freeze,const-fold,fold-bn,const-fold,cse,dce"
TRAINING_PIPELINE = "canonicalize,simplify,cse,dce"

__all__ = [
    "CONTRACT",
    "EXACT",
    "INFERENCE_PIPELINE",
    "TRAINING_PIPELINE",
    "VALUE_EQUAL",
    "PassContext",
    "PassInfo",
    "PassRecord",
    "PipelineResult",
    "RewriteRecord",
    "all_passes",
    "get_pass",
    "parse_pipeline",
    "register_pass",
    "run_pipeline",
]
