"""Regional compilation: a module whose call cannot be captured whole (``fullgraph=False``) runs
its own Python eagerly, and the calls it makes to its submodules go to compiled *regions*.

A :class:`RegionPlan` belongs to a module whose capture fell back. While that module runs
eagerly, each of its submodules has its ``forward`` replaced on the instance by a dispatch
(only for the duration of the call; another thread calling the same submodule meanwhile runs it
as written), so ``nn.Module.__call__`` runs the submodule's hooks eagerly, as written, and then
the dispatch. The first call of a submodule makes a *region engine* for it: a plait engine of its
own (guards, the gate's protocol, the manifest, the artifact cache) that captures the
submodule's forward. Hooks stay outside the region: their Python (a hook that collects outputs
in a list) runs on every call, never only at capture.
A submodule that captures whole is a region: its own submodules are never regions besides (the
largest region wins). One whose capture falls back gets a plan of its own and is split in turn,
recursively, down to modules that run eagerly because they have no capturable submodule.

Identical blocks (same classes, same parameter shapes and dtypes: the layers of a transformer)
share one capture and one compile: the program captured for the first is rebuilt for each other
with guards of its own (:func:`plait.snapshots.snapshot.program_from_doc`: it is shared only where
those guards hold), and the compiled artifact is reused as is. Such blocks keep their parameters
as graph inputs (``freeze`` off, unless requested): frozen weights would make each block's
artifact its own. :class:`RegionTree` holds the engines, the sharing tables and their counters.

The package: :mod:`~plait.regions.split` (how a module runs split: the dispatch slots of
:class:`RegionPlan`), :mod:`~plait.regions.tree` (the engines and the report),
:mod:`~plait.regions.sharing` (identical blocks) and :mod:`~plait.regions.op_counts` (compiled
and eager ops).

What ``plait.explain`` reports of ops: the *compiled* ops of a call are the IR nodes of the
regions it ran compiled (as captured, opaque nodes apart), the *eager* ops are the ATen operators
that ran outside any compiled region (counted by a ``TorchDispatchMode``); both are measured on
the first call that runs the plan, and again after a region's calls began to run another way: a
hook registered below a region makes its calls run split (its Python eagerly, its submodules as
regions), and the region is reported as split, with the hook as the reason, while they do.

Example:
    >>> import torch, warnings, plait
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         return self.a(x) if x.sum() > 0 else self.b(x)  # a data-dependent branch
    >>> cm = plait.compile(Net(), backend="eager", options={"cache": False})
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     _ = cm(torch.ones(2, 4)), cm(torch.ones(2, 4)), cm(-torch.ones(2, 4))
    >>> [(r["module"], r["status"]) for r in plait.explain(cm).regions["regions"]]
    [('a', 'compiled'), ('b', 'compiled')]
"""

from plait.regions.sharing import block_signature
from plait.regions.split import RegionPlan, call_forward, can_split, object_argument
from plait.regions.tree import RegionTree

__all__ = [
    "RegionPlan",
    "RegionTree",
    "block_signature",
    "call_forward",
    "can_split",
    "object_argument",
]
