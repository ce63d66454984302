"""``DataLoadingPrimer``: feeds prompt batches to ``ChatEnv.reset`` (TorchRL's transform of the same name).

* ``batch_size`` prompts per batch; ``repeats`` (G) copies of each prompt share one ``group_id`` (a GRPO
  group) and get ``sample_index`` 0..G-1. With ``group_repeats=True`` a batch holds all G copies of its
  prompts (B = batch_size * G, copies adjacent); with ``group_repeats=False`` (the default, as in TorchRL) copies
  come successively, ``batch_size`` slots per reset, so a group may span resets.
* Order: a seeded permutation per epoch (``seed``, epoch) when ``shuffle``; the source order otherwise.
  Batches cross epoch boundaries without dropping rows; no row repeats within an epoch.
* Cursor: :meth:`state_dict` is small JSON-able data (epoch, position, pending copies, group counter). A
  primer restored with :meth:`load_state_dict` over the same source continues with the next unseen prompts.
* Streams: an iterator without a length (TorchRL's endless ``DummyStrDataLoader``, a generator) is never
  materialised: rows are pulled in its own order as batches are drawn (``shuffle`` does not apply; a string item
  becomes the row ``{str_key: item}``; see :class:`~llmrl_core.envs.data_sources.RowStream`). Its cursor is the
  number of rows drawn: a restored primer over an iterator re-created in the same order skips that many.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from llmrl_core.envs.data_sources import RowSource, RowStream, is_stream, open_source
from llmrl_core.envs.torchrl_only import refuse_torchrl_only
from llmrl_core.envs.transforms.td_base import Transform
from llmrl_core.envs.types import PromptRow

_STATE_VERSION = 1


def _as_count(value: Any, name: str) -> int:
    """TorchRL passes sizes as ints, ``torch.Size([n])`` or ``(n,)``; None means 1."""
    if value is None:
        return 1
    if isinstance(value, int):
        return value
    dims = list(value)
    if len(dims) != 1:
        raise ValueError(f"{name} must be an int or a one-dimensional size, got {value!r}")
    return int(dims[0])


class _HostedOnRequest:
    """``DataLoadingPrimer(..., use_ray_service=True)`` builds the Dask-hosted
    :class:`~llmrl_core.envs.primer_hosted.RayDataLoadingPrimer` with the same arguments, as TorchRL's metaclass builds
    its Ray one (a base class, so that ``inspect.signature(DataLoadingPrimer)`` still shows ``__init__``'s)."""

    def __new__(cls, *args: Any, use_ray_service: bool = False, **kwargs: Any) -> Any:
        if use_ray_service and cls is DataLoadingPrimer:
            from llmrl_core.envs.primer_hosted import RayDataLoadingPrimer

            if args:  # the dataloader, TorchRL's one positional argument
                kwargs = {"dataloader": args[0], **kwargs}
            return RayDataLoadingPrimer(**kwargs)
        return super().__new__(cls)


class DataLoadingPrimer(_HostedOnRequest, Transform):
    """Draws prompt rows from a source in seeded order and expands them into GRPO groups.

    A TorchRL TensorDict transform (TorchRL's primer is one): appended to a ``ChatEnv`` it is the env's prompt source
    (llmrl's ``provide_prompts`` hook: a reset without prompts draws the next batch), its rows' fields are carried
    in the reset's and each step's data (TorchRL's layout) and its cursor is part of ``env.state_dict()``.
    """

    env_checkpoint = True

    def __init__(
        self,
        dataloader: Any = None,
        *,
        dataloader_factory: Any = None,
        batch_size: int | Any = None,
        repeats: int | None = None,
        group_repeats: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        rename: dict[str, str] | None = None,
        id_key: str | None = "id",
        str_key: str = "query",
        primers: Any = None,
        stack_method: Any = None,
        device: Any = None,
        use_ray_service: bool = False,
    ) -> None:
        super().__init__()
        refuse_torchrl_only(type(self).__name__, primers=primers, use_ray_service=use_ray_service)
        self.stack_method, self.device = stack_method, device  # kept for TorchRL's signature; rows are dicts here
        if (dataloader is None) == (dataloader_factory is None):
            raise ValueError("DataLoadingPrimer needs exactly one of dataloader and dataloader_factory")
        source = dataloader if dataloader is not None else dataloader_factory()
        if isinstance(source, DataLoader):
            source = source.dataset  # rows are drawn one by one here; the loader's batching is the env's
        batch_size = _as_count(batch_size, "batch_size")
        repeats = 1 if repeats is None else int(repeats)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.stream: RowStream | None = None
        if is_stream(source):
            self.stream = RowStream(source, type(source).__name__, str_key=str_key)
            self._stream_rows: dict[int, dict[str, Any]] = {}  # drawn rows whose copies are still owed
        else:
            self.source: RowSource = open_source(source)
            if len(self.source) == 0:
                raise ValueError(f"prompt source {self.source.name} is empty")
        self.batch_size = batch_size
        self.repeats = repeats
        self.group_repeats = group_repeats
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rename = dict(rename or {})
        self.id_key = id_key
        self._epoch = 0
        self._position = 0
        self._groups_served = 0
        self._pending: list[tuple[int, int, int]] = []  # (row index, group id, sample index)
        self._order = self._epoch_order(0) if self.stream is None else np.arange(0)

    @property
    def source_name(self) -> str:
        """The source's name, for messages."""
        return self.stream.name if self.stream is not None else self.source.name

    # --- ordering --------------------------------------------------------------------------------
    def _epoch_order(self, epoch: int) -> np.ndarray:
        n = len(self.source)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def _next_row_index(self) -> int:
        if self.stream is not None:
            index = self.stream.drawn
            self._stream_rows[index] = self.stream.next_row()
            return index
        if self._position >= len(self._order):
            self._epoch += 1
            self._position = 0
            self._order = self._epoch_order(self._epoch)
        index = int(self._order[self._position])
        self._position += 1
        return index

    def _next_group(self) -> list[tuple[int, int, int]]:
        row_index = self._next_row_index()
        group_id = self._groups_served
        self._groups_served += 1
        return [(row_index, group_id, k) for k in range(self.repeats)]

    # --- drawing ---------------------------------------------------------------------------------
    def next_batch(self) -> list[PromptRow]:
        """The next batch of prompt rows (see the module docstring for its size and order)."""
        if self.group_repeats:
            picks = [pick for _ in range(self.batch_size) for pick in self._next_group()]
        else:
            while len(self._pending) < self.batch_size:
                self._pending.extend(self._next_group())
            picks, self._pending = self._pending[: self.batch_size], self._pending[self.batch_size :]
        return [self._make_row(*pick) for pick in picks]

    def _make_row(self, row_index: int, group_id: int, sample_index: int) -> PromptRow:
        if self.stream is not None:
            last_copy = sample_index == self.repeats - 1
            data = dict(self._stream_rows.pop(row_index) if last_copy else self._stream_rows[row_index])
        else:
            data = self.source[row_index]
        for old, new in self.rename.items():
            if old not in data:
                raise ValueError(f"{self.source_name}: row {row_index} has no field {old!r} (fields: {sorted(data)})")
            data[new] = data.pop(old)
        prompt_id = data.get(self.id_key, row_index) if self.id_key else row_index
        return PromptRow(data=data, prompt_id=prompt_id, group_id=group_id, sample_index=sample_index)

    def provide_prompts(self, batch_size: int | None) -> list[PromptRow]:
        """The env's hook: a reset without prompts draws the next batch."""
        rows = self.next_batch()
        if batch_size is not None and len(rows) != batch_size:
            raise ValueError(
                f"DataLoadingPrimer yields {len(rows)} slots per batch (batch_size={self.batch_size}, "
                f"repeats={self.repeats}, group_repeats={self.group_repeats}) but the env expects {batch_size}"
            )
        return rows

    def reset_dataloader(self, seed: int | None = None) -> DataLoadingPrimer:
        """Restart from the first prompt of epoch 0 (optionally with a new seed); group ids keep counting."""
        if seed is not None:
            self.seed = int(seed)
        if self.stream is not None:
            self._stream_rows = {}  # an iterator cannot start again: it goes on where it is
        self._epoch = 0
        self._position = 0
        self._pending = []
        self._order = self._epoch_order(0) if self.stream is None else np.arange(0)
        return self

    @property
    def epoch(self) -> int:
        """Index of the epoch the next prompt comes from (0-based; a stream is one endless epoch)."""
        if self.stream is not None:
            return 0
        return self._epoch + (1 if self._position >= len(self._order) else 0)

    # --- cursor ----------------------------------------------------------------------------------
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """JSON-able cursor: where the next prompt comes from, and the copies still owed."""
        if self.stream is not None:
            return {
                "version": _STATE_VERSION,
                "stream": True,
                "drawn": self.stream.drawn,
                "groups_served": self._groups_served,
                "pending": [list(p) for p in self._pending],
                "pending_rows": {str(k): v for k, v in self._stream_rows.items()},
            }
        return {
            "version": _STATE_VERSION,
            "num_rows": len(self.source),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self._epoch,
            "position": self._position,
            "groups_served": self._groups_served,
            "pending": [list(p) for p in self._pending],
        }

    def load_state_dict(self, state: dict[str, Any], *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Restore a cursor saved by :meth:`state_dict` (same source, same seed and shuffle setting)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"primer state version {state.get('version')!r} is not {_STATE_VERSION}")
        if bool(state.get("stream")) != (self.stream is not None):
            kind = "a stream" if state.get("stream") else "a sized source"
            raise ValueError(f"primer state was saved for {kind}, this primer reads {self.source_name}")
        if self.stream is not None:
            self.stream.skip(int(state["drawn"]) - self.stream.drawn)
            self._groups_served = int(state["groups_served"])
            self._pending = [tuple(p) for p in state["pending"]]  # type: ignore[misc]
            self._stream_rows = {int(k): dict(v) for k, v in state["pending_rows"].items()}
            return
        if state["num_rows"] != len(self.source):
            raise ValueError(
                f"primer state was saved for {state['num_rows']} rows but {self.source.name} has {len(self.source)}"
            )
        if state["shuffle"] != self.shuffle:
            raise ValueError(f"primer state has shuffle={state['shuffle']}, this primer has shuffle={self.shuffle}")
        self.seed = int(state["seed"])
        self._epoch = int(state["epoch"])
        self._order = self._epoch_order(self._epoch)
        self._position = int(state["position"])
        self._groups_served = int(state["groups_served"])
        self._pending = [tuple(p) for p in state["pending"]]  # type: ignore[misc]

    def __repr__(self) -> str:
        return (
            f"DataLoadingPrimer(source={self.source_name!r}, "
            f"rows={'stream' if self.stream is not None else len(self.source)}, batch_size={self.batch_size}, "
            f"repeats={self.repeats}, group_repeats={self.group_repeats}, shuffle={self.shuffle}, seed={self.seed})"
        )
