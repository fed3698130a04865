"""Which modules had an attribute set while ``batch_map`` records, so that cached calls of a
module changed between calls are traced again.

A cached call does not run the module's Python, so it uses the attributes the module had when
its entry was made (``self.scale``, a submodule, a parameter, ``training`` of a submodule).
While the hooks are in place, ``nn.Module.__setattr__`` notes the module it sets an attribute
of and the count of such sets (:data:`EPOCH`); a module cache that sees the count move drops
the entries one of whose modules had an attribute set since the entry was made (set to an
equal value too: its next calls are traced again, no more). A change inside a list or dict
attribute, made without setting an attribute, is not seen (the README says to mark such
modules ``bf.no_cache``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

EPOCH = [0]
"""How many module attributes were set while the hooks were in place."""

SET_AT: dict[int, int] = {}
"""``id(module)`` -> the :data:`EPOCH` of its last attribute set."""

ORIGINAL_SETATTR = nn.Module.__setattr__


ACTIVE = [0]
"""How many ``batch_map`` calls are recording (the hooks' count): only then are sets noted."""


def module_setattr(module: nn.Module, name: str, value: Any) -> None:
    """``nn.Module.__setattr__``, noting the module while ``batch_map`` records (see the
    module docstring). It takes PyTorch's place once, at the first ``batch_map``, and stays:
    replacing a method of ``nn.Module`` updates a slot of every subclass, about 0.15 ms
    each way, and slows attribute lookups after it, too much for every call."""
    if ACTIVE[0]:
        EPOCH[0] += 1
        SET_AT[id(module)] = EPOCH[0]
    ORIGINAL_SETATTR(module, name, value)


class Watch:
    """The modules of a cache entry (the module and its submodules), and the :data:`EPOCH` at
    which the entry was made."""

    __slots__ = ("members", "since")

    def __init__(self, module: nn.Module) -> None:
        self.members = [id(m) for m in module.modules()]
        self.since = EPOCH[0]

    def changed(self) -> bool:
        """Whether one of the modules had an attribute set since the entry was made."""
        since = self.since
        return any(SET_AT.get(m, 0) > since for m in self.members)
