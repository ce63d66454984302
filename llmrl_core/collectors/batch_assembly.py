"""How :class:`~llmrl_core.collectors.llm_collector.LLMCollector` cuts the stream of items its schedules produce
into the batches it hands out (:class:`BatchAssembly`, one of its base classes): whole episodes, dialog turns, or
(TorchRL's step layout) whole env steps, as many as reach ``dialog_turns_per_batch``, stacked into one TensorDict
(``(batch, steps)`` or flattened for the step layout)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tensordict import TensorDictBase, lazy_stack

from llmrl_core.collectors.tensordict_batches import stack_rows
from llmrl_core.envs.chat_env import ChatEnv


class BatchAssembly:
    """The collector's batching; the collector sets ``envs``, ``async_envs``, ``dialog_turns_per_batch``,
    ``flatten_data``, ``_yield_trajectories`` and ``_step_layout`` and has the schedules ``_run_sync`` /
    ``_run_async`` and ``_finished``."""

    envs: list[ChatEnv]
    async_envs: bool
    dialog_turns_per_batch: int | None
    flatten_data: bool
    _yield_trajectories: bool
    _step_layout: bool

    def _to_tensordict(self, units: list[Any]) -> TensorDictBase:
        """One batch as a TensorDict. Dialog turns of whole env steps come as TorchRL lays them out: ``(batch,
        steps)``, row ``b`` slot ``b``'s turns in order, or with ``flatten_data`` that viewed as ``(batch * steps,)``
        slot after slot. A batch with a step that not every slot answered (the prompts ran out, or the total left
        room for fewer turns than slots) is flat, step after step."""
        if not self._step_layout:
            return stack_rows(units)
        if units and all(len(step) == self.envs[0].num_slots for step in units):
            batch = lazy_stack([stack_rows(step) for step in units], -1)
            return batch.view(-1) if self.flatten_data else batch
        return stack_rows([turn for step in units for turn in step])

    def _item_batches(self) -> Iterator[list[Any]]:
        """The batches as lists of rows before they are stacked: episodes, dialog turns, or (step layout) lists of
        one env step's dialog turns."""
        stream = self._run_async() if self.async_envs else self._run_sync()
        buffer: list[Any] = []
        try:
            for items in stream:
                if not self._step_layout:
                    buffer.extend(items)
                elif items:
                    buffer.append(items)
                while buffer and self._batch_ready(buffer):
                    batch, buffer = self._split_batch(buffer)
                    yield batch
                if self._finished():
                    break
            if buffer:
                yield buffer
        finally:
            stream.close()

    def _unit_turns(self, unit: Any) -> int:
        """Dialog turns in one buffered unit: an episode, one env step's turns (step layout), or one turn."""
        if self._yield_trajectories:
            return int(unit["num_turns"])
        return len(unit) if self._step_layout else 1

    def _turns(self, items: list[Any]) -> int:
        return sum(self._unit_turns(unit) for unit in items)

    def _batch_ready(self, buffer: list[Any]) -> bool:
        if self.dialog_turns_per_batch is None:
            return True
        return self._turns(buffer) >= self.dialog_turns_per_batch

    def _split_batch(self, buffer: list[Any]) -> tuple[list[Any], list[Any]]:
        if self.dialog_turns_per_batch is None:
            return buffer, []
        if not self._yield_trajectories and not self._step_layout:
            n = self.dialog_turns_per_batch
            return buffer[:n], buffer[n:]
        taken, turns = 0, 0  # whole episodes / whole steps, as many as reach the batch size
        while taken < len(buffer) and turns < self.dialog_turns_per_batch:
            turns += self._unit_turns(buffer[taken])
            taken += 1
        return buffer[:taken], buffer[taken:]
