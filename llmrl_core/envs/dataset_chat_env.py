"""``DatasetChatEnv``: a :class:`~llmrl_core.envs.chat_env.ChatEnv` fed by a :class:`DataLoadingPrimer`.

``reset()`` with no arguments draws the next batch of prompts (a TensorDict, as TorchRL's; ``reset_batch()`` is
llmrl's list call, with its per-row entries), so a rollout loop only calls ``reset`` / ``step``. The primer
is the first (TensorDict) transform; its cursor is part of ``env.state_dict()`` for resuming.

TorchRL's arguments work as documented: ``num_envs`` slots per reset (with ``group_repeats`` they hold
``num_envs // repeats`` prompts, all copies together), ``dataset`` + ``name`` + ``split`` load with
``datasets.load_dataset`` (a local folder or an offline cache; the hub is not reached from here), ``collate_fn``
maps each drawn batch of rows (a list of dicts, or TorchRL's dict of lists), ``seed=None`` draws a random seed,
``device``, ``batch_size_dl``, ``apply_template`` are accepted. llmrl's own: ``batch_size`` (prompts per reset,
instead of ``num_envs``), ``rename``, ``id_key``, ``chat_template_name``, ``max_turns`` and a ready ``primer``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from llmrl_core.envs.chat_env import ChatEnv, InputMode
from llmrl_core.envs.data_sources import transpose_columns
from llmrl_core.envs.primer import DataLoadingPrimer
from llmrl_core.envs.torchrl_only import refuse_torchrl_only


def load_named_dataset(dataset: Any, name: str | None, split: str | None) -> Any:
    """``dataset`` as given, or (a string that is not a file, or with ``name``/``split``) the split of
    ``datasets.load_dataset(dataset, name)`` (``train`` when ``split`` is None and there is one)."""
    if not isinstance(dataset, str) or (Path(dataset).is_file() and name is None and split is None):
        return dataset
    from datasets import load_dataset

    loaded = load_dataset(dataset, name)
    if split is None and "train" in loaded:
        split = "train"
    return loaded[split] if split is not None else loaded


def rows_of(batch: Any) -> list[dict[str, Any]]:
    """A collated batch as rows: a list of dicts as is, TorchRL's dict of equal-length lists transposed."""
    if isinstance(batch, dict):
        rows = transpose_columns({k: list(v) for k, v in batch.items()})
        if rows is None:
            raise ValueError(
                f"collate_fn returned columns of different lengths: { {k: len(v) for k, v in batch.items()} }"
            )
        return rows
    return [dict(row) for row in batch]


class CollatedPrimer(DataLoadingPrimer):
    """A :class:`DataLoadingPrimer` whose batches go through a ``collate_fn`` (TorchRL's DataLoader hook)."""

    def __init__(self, dataloader: Any, *, collate_fn: Callable[[list[dict[str, Any]]], Any], **kwargs: Any) -> None:
        super().__init__(dataloader, **kwargs)
        self.collate_fn = collate_fn

    def next_batch(self) -> list[Any]:
        rows = super().next_batch()
        mapped = rows_of(self.collate_fn([row.data for row in rows]))
        if len(mapped) != len(rows):
            raise ValueError(f"collate_fn returned {len(mapped)} rows for a batch of {len(rows)}")
        for row, data in zip(rows, mapped, strict=True):
            row.data = data
        return rows


class DatasetChatEnv(ChatEnv):
    """A ChatEnv whose prompts come from a dataset (HF ``Dataset``, jsonl/parquet path or iterable of dicts)."""

    def __init__(
        self,
        dataset: Any = None,
        *,
        shuffle: bool = True,
        name: str | None = None,
        split: str | None = None,
        num_envs: int = 1,
        repeats: int | None = None,
        batch_size_dl: int = 1,
        seed: int | None = None,
        group_repeats: bool = False,
        tokenizer: Any = None,
        device: torch.device | str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        apply_template: bool | None = False,
        collate_fn: Callable[[Any], Any] | None = None,
        input_mode: InputMode = "history",
        data_key: str | None = None,
        primers: Any = None,
        system_prompt: str | None = None,
        ray_backend: bool = False,
        dataloader_actor_name: str | None = None,
        batch_size: int | None = None,
        rename: dict[str, str] | None = None,
        id_key: str | None = "id",
        chat_template_name: str | None = None,
        max_turns: int | None = 1,
        primer: DataLoadingPrimer | None = None,
    ) -> None:
        refuse_torchrl_only(type(self).__name__, primers=primers, ray_backend=ray_backend)
        if dataset is None and primer is None:
            raise ValueError(f"{type(self).__name__} needs a dataset (or a ready primer)")
        repeats = 1 if repeats is None else int(repeats)
        if batch_size is None:
            if group_repeats and num_envs % repeats:
                raise ValueError(f"num_envs={num_envs} is not a multiple of repeats={repeats} (group_repeats=True)")
            batch_size = num_envs // repeats if group_repeats else num_envs
        super().__init__(
            system_prompt=system_prompt,
            tokenizer=tokenizer,
            input_mode=input_mode,
            template_kwargs=template_kwargs,
            chat_template_name=chat_template_name,
            data_key=data_key or "query",
            max_turns=max_turns,
            device=device,
        )
        self.batch_size_dl = batch_size_dl
        self.apply_template = apply_template
        if primer is None:
            options = dict(
                batch_size=batch_size,
                repeats=repeats,
                group_repeats=group_repeats,
                shuffle=shuffle,
                seed=secrets.randbits(31) if seed is None else seed,
                rename=rename,
                id_key=id_key,
            )
            source = load_named_dataset(dataset, name, split)
            primer = (
                DataLoadingPrimer(source, **options)
                if collate_fn is None
                else CollatedPrimer(source, collate_fn=collate_fn, **options)
            )
        self.primer = primer
        self.append_transform(self.primer)

    def reset_dataloader(self, seed: int | None = None) -> DatasetChatEnv:
        """Restart the prompt stream from the beginning (see ``DataLoadingPrimer.reset_dataloader``); returns
        the env, as TorchRL's does."""
        self.primer.reset_dataloader(seed)
        return self
