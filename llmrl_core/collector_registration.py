"""The weak link from an env or a policy wrapper back to the collector that drives it (TorchRL's
``register_collector``), kept out of pickles so a registered object can still be copied or shipped to a worker."""

from __future__ import annotations

import weakref
from typing import Any


class CollectorRegistration:
    """Mixin: ``register_collector(collector)`` keeps a weak reference, ``collector`` returns it (or None).

    ``LLMCollector`` calls ``register_collector`` on its env and its policy, as TorchRL's collectors do;
    ``RetrieveKL(gen_model="from_collector")`` finds the policy through it. A pickled copy drops the reference:
    whoever drives the copy registers again."""

    _collector: weakref.ReferenceType[Any] | None = None

    def register_collector(self, collector: Any) -> None:
        """Keep a weak reference to the collector driving this object."""
        self._collector = weakref.ref(collector)

    @property
    def collector(self) -> Any:
        """The collector this object was registered with, or None."""
        return self._collector() if self._collector is not None else None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_collector"] = None
        return state
