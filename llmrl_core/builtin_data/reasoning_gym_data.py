"""Prompt rows from a `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ procedural dataset.

``reasoning-gym`` is an optional extra (``pip install 'llmrl[envs]'``). A run names one of its datasets and that
dataset's own config (``env.args: {dataset: chain_sum, config: {min_terms: 2}}``); the rows are generated on demand,
by index, so a large ``size`` costs nothing until a row is read.

Splits come from disjoint seeds: ``train`` uses ``seed``, ``test`` uses ``seed + TEST_SEED_OFFSET``. Each row keeps
where it came from (``rg_dataset``, ``rg_split``, ``rg_index``), so the reward can rebuild the exact entry (its
metadata included) and ask the dataset's own ``score_answer``.

Source strings (``data.source`` / ``task.eval_source``): ``reasoning_gym:train`` and ``reasoning_gym:test``; the
dataset and its config are the run's ``env.args``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

TEST_SEED_OFFSET = 1_000_003
SPLITS = ("train", "test")
DEFAULT_SIZES = {"train": 10_000, "test": 2_000}  # some datasets precompute or cap their size
SOURCE_PREFIX = "reasoning_gym:"


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ValueError(
            "env.name=reasoning_gym needs the optional 'reasoning-gym' package: pip install 'llmrl[envs]' "
            f"(or pip install reasoning-gym) ({err})"
        ) from err
    return reasoning_gym


@dataclass(frozen=True)
class ReasoningGymSpec:
    """Which reasoning-gym dataset, with which config, seed and split sizes (``env.args`` of a run)."""

    dataset: str
    config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    size: int | None = None  # rows of the train split (None: DEFAULT_SIZES)
    test_size: int | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], setting: str = "env.args") -> ReasoningGymSpec:
        """From a run's ``env.args`` (errors name the setting and list what is valid)."""
        valid = {"dataset", "config", "seed", "size", "test_size"}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"{setting}: unknown key(s) {unknown} for reasoning_gym; valid: {sorted(valid)}")
        if not options.get("dataset"):
            raise ValueError(f"{setting}.dataset: name a reasoning-gym dataset (e.g. chain_sum)")
        config = options.get("config") or {}
        if not isinstance(config, Mapping):
            raise ValueError(f"{setting}.config: expected a mapping of the dataset's settings, got {config!r}")
        for key in ("seed", "size", "test_size"):
            value = options.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{setting}.{key}: expected an integer >= 0, got {value!r}")
        return cls(
            dataset=str(options["dataset"]),
            config=dict(config),
            seed=int(options.get("seed") or 0),
            size=options.get("size"),
            test_size=options.get("test_size"),
        )

    def split_seed(self, split: str) -> int:
        """The dataset seed of ``split`` (train and test never share one)."""
        if split not in SPLITS:
            raise ValueError(f"reasoning_gym split must be one of {SPLITS}, got {split!r}")
        return self.seed if split == "train" else self.seed + TEST_SEED_OFFSET

    def split_size(self, split: str) -> int:
        """Rows in ``split``."""
        given = self.size if split == "train" else self.test_size
        return int(given) if given else DEFAULT_SIZES[split]

    def validate(self, setting: str = "env.args") -> None:
        """Check the dataset name and its config by building one row (before any engine starts)."""
        rg = _reasoning_gym()
        names = sorted(rg.factory.DATASETS)
        if self.dataset not in names:
            close = difflib.get_close_matches(self.dataset, names, n=3)
            hint = f"; did you mean {close}?" if close else f"; known: {names}"
            raise ValueError(f"{setting}.dataset: {self.dataset!r} is not a reasoning-gym dataset{hint}")
        try:
            first = dataset(self, "train")[0]
        except (TypeError, ValueError, AssertionError, KeyError) as err:
            sizes = f"{self.split_size('train')} train / {self.split_size('test')} test rows"
            sizes += f": {setting}.size / test_size"
            why = f"{type(err).__name__}: {err}" if isinstance(err, AssertionError) else str(err)
            raise ValueError(
                f"{setting}.config: reasoning-gym {self.dataset!r} refused its config ({why}; split sizes {sizes})"
            ) from err
        if str(first["question"]) != str(dataset(self, "train")[0]["question"]):
            raise ValueError(
                f"{setting}.dataset: reasoning-gym's {self.dataset!r} gives two different entries for the same index "
                "(it is not deterministic), so a stored row could not be scored against its entry; pick another "
                "dataset"
            )


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 2 for v in value) and value:
        return {k: _thaw(v) for k, v in value}
    return value


@lru_cache(maxsize=16)
def _cached_dataset(name: str, frozen_config: Any, seed: int, size: int) -> Any:
    config = _thaw(frozen_config) if frozen_config else {}
    return _reasoning_gym().create_dataset(name, seed=seed, size=size, **config)


def dataset(spec: ReasoningGymSpec, split: str) -> Any:
    """The reasoning-gym dataset object of ``split`` (cached per process: rows and scores reuse it)."""
    return _cached_dataset(spec.dataset, _freeze(spec.config), spec.split_seed(split), spec.split_size(split))


class ReasoningGymRows(Sequence):
    """A split as prompt rows (``question``, ``answer`` and where the row came from), generated when read."""

    def __init__(self, spec: ReasoningGymSpec, split: str, n: int | None = None) -> None:
        self.spec = spec
        self.split = split
        self._dataset = dataset(spec, split)
        self._len = min(len(self._dataset), n) if n is not None else len(self._dataset)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if not -self._len <= index < self._len:
            raise IndexError(f"reasoning_gym:{self.split} has {self._len} rows, asked for {index}")
        index = index % self._len
        entry = self._dataset[index]
        return {
            "question": str(entry["question"]),
            "answer": "" if entry["answer"] is None else str(entry["answer"]),  # open-ended tasks have none
            "rg_dataset": self.spec.dataset,
            "rg_split": self.split,
            "rg_index": index,
        }


def is_reasoning_gym_source(source: Any) -> bool:
    """Whether a source string names a reasoning-gym split."""
    return isinstance(source, str) and source.startswith(SOURCE_PREFIX)


def reasoning_gym_rows(source: str, env_options: Mapping[str, Any] | None, n: int | None = None) -> ReasoningGymRows:
    """The rows of ``reasoning_gym:<split>`` for the dataset named in ``env_options`` (a run's ``env.args``)."""
    split = source.removeprefix(SOURCE_PREFIX)
    if split not in SPLITS:
        raise ValueError(f"source {source!r}: expected reasoning_gym:train or reasoning_gym:test")
    if not env_options or not env_options.get("dataset"):
        raise ValueError(
            f"source {source!r} needs env.name=reasoning_gym with env.args.dataset naming a reasoning-gym dataset"
        )
    return ReasoningGymRows(ReasoningGymSpec.from_options(env_options), split, n)


def score_entry(spec: ReasoningGymSpec, row: Mapping[str, Any], answer: str) -> float:
    """The dataset's own ``score_answer`` of ``answer`` for ``row`` (its exact entry when the row says where it came
    from, else an entry made of the row's question, answer and metadata fields)."""
    split, index = row.get("rg_split"), row.get("rg_index")
    if split in SPLITS and index is not None and row.get("rg_dataset", spec.dataset) == spec.dataset:
        ds = dataset(spec, str(split))
        entry = ds[int(index)]
        if str(entry["question"]) != str(row.get("question", entry["question"])):
            raise ValueError(
                f"reasoning_gym row {split}[{index}]: the stored question differs from {spec.dataset!r}'s entry "
                "(the dataset's config or seed changed since the row was made)"
            )
    else:
        ds = dataset(spec, "train")
        entry = {"question": row.get("question", ""), "answer": row.get("answer", ""), "metadata": {}}
        entry["metadata"] = dict(row.get("metadata") or {})
    return float(ds.score_answer(answer, entry) or 0.0)
