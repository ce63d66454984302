"""``InitConfig``: where a new run's weights start — the configured model, or a published version of another run
(a fork: ``--set init.from=RUN@V``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from llmrl_core.paths import SAFE_NAME


@dataclass
class InitConfig:
    """The starting point of a new run (a resumed run goes on from its own versions).

    ``from``: ``RUN@V`` starts from version ``V`` of run ``RUN`` (its weights, its optimizer and RNG state when
    kept), ``RUN`` alone from its last published version; empty: the ``model`` setting. ``data_cursor``: also
    continue that version's data cursor (the prompts it would have drawn next) instead of the data's start.
    """

    from_: Annotated[str | None, Field(alias="from")] = None  # RUN@V or RUN to start from (key ``from``: a keyword)
    data_cursor: bool = False

    def __post_init__(self) -> None:
        if self.from_ is not None:
            self.source()  # a malformed value fails here, before anything starts

    def source(self) -> tuple[str, int | None] | None:
        """``(run, version)`` of ``from`` (version None: the run's last published one), or None."""
        if not self.from_:
            return None
        run, at, version = self.from_.partition("@")
        if not SAFE_NAME.fullmatch(run) or (at and not version.isdigit()):
            raise ValueError(
                f"init.from must be RUN@VERSION (e.g. gsm8k-001@4) or RUN (its last published version), got "
                f"{self.from_!r}"
            )
        return run, int(version) if at else None
