"""Names a package's face offers that load on first use (their modules pull in vLLM, tools or other heavy parts)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each of ``names`` (name -> module) when first asked."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
