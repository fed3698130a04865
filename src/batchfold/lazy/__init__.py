"""The lazy front end: single-instance PyTorch code, recorded per instance, run batched.

``batch_map(fn, instances)`` runs ``fn`` on each instance under a ``TorchFunctionMode``.
Tensors that an instance creates, and everything computed from them, are :class:`Lazy`:
each PyTorch call on them adds a node to the :class:`~batchfold.graph.Graph` instead of
computing. Tensors from outside (parameters, buffers) are shared by identity. When every
instance has been recorded, ``schedule`` and ``execute`` run the graph, and the lazy results
are replaced by real tensors that autograd can differentiate.

Modules: ``tensor`` (the :class:`Lazy` tensor and its methods), ``recorder`` (the mode that
turns calls into nodes), ``semantics`` (views, randomness, in-place forms, grad modes),
``inference`` (output shapes of a new kind of node), ``sources`` (per-instance constants),
``sync`` (the greenlet driver behind sync points) and ``api`` (``batch_map``,
``function``). Other front ends join a running batch through :func:`active_recorder` and
:meth:`Recorder.call`.
"""

from .api import batch_map, last_stats
from .context import active_recorder
from .function import BatchedFunction, function
from .recorder import Recorder
from .sites import func_name, user_site
from .tensor import Lazy

__all__ = [
    "BatchedFunction",
    "Lazy",
    "Recorder",
    "active_recorder",
    "batch_map",
    "func_name",
    "function",
    "last_stats",
    "user_site",
]
