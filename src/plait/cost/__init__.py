"""plait.cost: the cost model (per node: operations and bytes moved) and compile budgets.

Each compile records its graph's estimate in the manifest (``manifest.graph["cost"]``) and, with
``options={"budgets": {...}}``, checks its stages against them (:mod:`plait.cost.budgets`).
:func:`plait.diagnose.break_even` weighs a specialization's compile time against what it saves
per call.

Example:
    >>> from plait.cost import Budgets, estimate
    >>> Budgets.of(None) is None
    True
"""

from plait.cost.budgets import Budgets, Miss, enforce
from plait.cost.model import Cost, GraphCost, estimate, node_cost

__all__ = ["Budgets", "Cost", "GraphCost", "Miss", "enforce", "estimate", "node_cost"]
