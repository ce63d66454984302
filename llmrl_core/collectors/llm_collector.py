"""``LLMCollector``: run chat environments with a policy and hand out trajectories or dialog turns.

Two schedules:

* **sync** (one batched env): every step generates for all active slots at once, then steps the env;
  a batch of slots is reset when all of its slots are done.
* **async** (``async_envs=True``, a list of envs — typically one GRPO group per env): each env steps in
  its own thread, and the collector generates for whichever envs are ready. A slow tool call in one env
  (a sandboxed interpreter, an MCP server) holds up only that env; the others keep generating.

Every sampled turn is stamped with the policy version current when it was sampled. The version lives in
a :class:`~llmrl_core.envs.transforms.policy_version.PolicyVersion` (the env's own, if it has one), which
:meth:`LLMCollector.increment_version` — or a ``vLLMUpdater`` it is registered with — advances.

Batches are lists of :class:`~llmrl_core.collectors.trajectory.Trajectory` (``yield_completed_trajectories``,
the default) or of :class:`~llmrl_core.collectors.trajectory.DialogTurn`. With a ``sink`` (a
``queue.Queue`` or anything with ``extend``), every batch is also delivered there.
"""

from __future__ import annotations

import queue as queue_module
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from llmrl_core.collectors.trajectory import DialogTurn, Trajectory
from llmrl_core.data.history import HistoryBatch
from llmrl_core.data.llm_data import LLMData
from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.transforms.policy_version import PolicyVersion
from llmrl_core.envs.types import EnvOutput

Policy = Callable[[LLMData], Any]


def select_slots(out: EnvOutput, indices: Sequence[int]) -> LLMData:
    """The prompts of ``indices`` in ``out`` as an :class:`LLMData` (all input modes carried along)."""
    return LLMData(
        history=HistoryBatch([out.history[i] for i in indices]),
        text=[out.text[i] for i in indices] if out.text is not None else None,
        tokens=[out.tokens[i] for i in indices] if out.tokens is not None else None,
    )


class _EnvTracker:
    """Per-env bookkeeping: versions and summed reward components of each slot's running episode."""

    def __init__(self, env: ChatEnv) -> None:
        self.env = env
        self.out: EnvOutput | None = None
        self.versions: dict[int, list[int | str]] = {}
        self.components: dict[int, dict[str, float]] = {}

    def reset(self, prompts: list[Any] | None) -> EnvOutput:
        self.out = self.env.reset(prompts) if prompts is not None else self.env.reset()
        self.versions = {i: [] for i in range(self.out.batch_size)}
        self.components = {i: {} for i in range(self.out.batch_size)}
        return self.out

    def record_step(self, out: EnvOutput, active: Sequence[int], version: int | str) -> None:
        for i in active:
            self.versions[i].append(version)
            for name, value in out.reward_components[i].items():
                self.components[i][name] = self.components[i].get(name, 0.0) + value
        self.out = out

    def trajectories(self) -> list[Trajectory]:
        tokens_mode = self.env.input_mode == "tokens"
        return [
            Trajectory.from_slot(slot, self.versions[slot.index], self.components[slot.index], tokens_mode)
            for slot in self.env.slots
        ]


class LLMCollector:
    """Runs env(s) and a policy together; iterate it for batches (see the module docstring).

    ``policy`` is a wrapper from :mod:`llmrl_core.policies` (or any callable taking :class:`LLMData` and
    returning an object with ``responses()``). ``prompts`` optionally feeds resets from an iterable of
    rows (otherwise each env's primer does), ``prompts_per_reset`` at a time (default: the env's batch size).
    ``dialog_turns_per_batch`` sets the batch size in turns (in
    trajectory mode: at least that many turns of finished trajectories); ``total_dialog_turns`` or
    ``total_trajectories`` end the iteration.
    """

    def __init__(
        self,
        env: ChatEnv | Sequence[ChatEnv],
        policy: Policy,
        *,
        dialog_turns_per_batch: int | None = None,
        total_dialog_turns: int | None = None,
        total_trajectories: int | None = None,
        yield_completed_trajectories: bool = True,
        prompts: Iterable[Any] | None = None,
        prompts_per_reset: int | None = None,
        sink: Any = None,
        policy_version: PolicyVersion | None = None,
        async_envs: bool = False,
    ) -> None:
        self.envs = list(env) if isinstance(env, Sequence) else [env]
        if not self.envs:
            raise ValueError("LLMCollector needs at least one env")
        if not async_envs and len(self.envs) != 1:
            raise ValueError("several envs need async_envs=True (the sync collector steps one batched env)")
        self.policy = policy
        self.async_envs = async_envs
        self.yield_completed_trajectories = yield_completed_trajectories
        self.dialog_turns_per_batch = dialog_turns_per_batch
        self.total_dialog_turns = total_dialog_turns
        self.total_trajectories = total_trajectories
        self.sink = sink
        self._prompts = iter(prompts) if prompts is not None else None
        self.prompts_per_reset = prompts_per_reset
        self._prompt_lock = threading.Lock()
        self.version_tracker = policy_version or self._find_version_tracker() or PolicyVersion()
        self.turns_collected = 0
        self.trajectories_collected = 0

    # --- versions --------------------------------------------------------------------------------
    def _find_version_tracker(self) -> PolicyVersion | None:
        for env in self.envs:
            for transform in env.transforms:
                if isinstance(transform, PolicyVersion):
                    return transform
        return None

    @property
    def policy_version(self) -> int | str:
        """The version stamped on turns sampled from now on."""
        return self.version_tracker.version

    def increment_version(self) -> int | str:
        """Advance the policy version (call after the policy's weights changed)."""
        return self.version_tracker.increment_version()

    # --- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[list[Trajectory] | list[DialogTurn]]:
        stream = self._run_async() if self.async_envs else self._run_sync()
        buffer: list[Any] = []
        try:
            for items in stream:
                buffer.extend(items)
                while buffer and self._batch_ready(buffer):
                    batch, buffer = self._split_batch(buffer)
                    self._deliver(batch)
                    yield batch
                if self._finished():
                    break
            if buffer:
                self._deliver(buffer)
                yield buffer
        finally:
            stream.close()

    def collect(self) -> list[Any]:
        """Run to the configured total and return everything, flattened (needs a total)."""
        if self.total_dialog_turns is None and self.total_trajectories is None:
            raise ValueError("collect() needs total_dialog_turns or total_trajectories")
        return [item for batch in self for item in batch]

    def _turns(self, items: list[Any]) -> int:
        return sum(t.num_turns for t in items) if self.yield_completed_trajectories else len(items)

    def _batch_ready(self, buffer: list[Any]) -> bool:
        if self.dialog_turns_per_batch is None:
            return True
        return self._turns(buffer) >= self.dialog_turns_per_batch

    def _split_batch(self, buffer: list[Any]) -> tuple[list[Any], list[Any]]:
        if self.dialog_turns_per_batch is None:
            return buffer, []
        if not self.yield_completed_trajectories:
            n = self.dialog_turns_per_batch
            return buffer[:n], buffer[n:]
        taken, turns = 0, 0
        while taken < len(buffer) and turns < self.dialog_turns_per_batch:
            turns += buffer[taken].num_turns
            taken += 1
        return buffer[:taken], buffer[taken:]

    def _deliver(self, batch: list[Any]) -> None:
        if self.sink is None:
            return
        if isinstance(self.sink, queue_module.Queue):
            self.sink.put(batch)
        else:
            self.sink.extend(batch)

    def _finished(self) -> bool:
        if self.total_dialog_turns is not None and self.turns_collected >= self.total_dialog_turns:
            return True
        return self.total_trajectories is not None and self.trajectories_collected >= self.total_trajectories

    def _next_prompts(self, env: ChatEnv) -> list[Any] | None:
        if self._prompts is None:
            return None
        size = self.prompts_per_reset or env.batch_size or 1
        with self._prompt_lock:
            rows = [row for _, row in zip(range(size), self._prompts, strict=False)]
        if not rows:
            raise StopIteration
        return rows

    # --- producing items -------------------------------------------------------------------------
    def _generate(self, data: LLMData) -> list[Any]:
        return self.policy(data).responses()

    def _snapshot(self, out: EnvOutput, active: Sequence[int]) -> list[Any] | None:
        """Copies of the prompts about to be answered (the env mutates its histories in ``step``)."""
        return None if self.yield_completed_trajectories else [out.history[i].copy() for i in active]

    def _finish_step(self, tracker: _EnvTracker, prompts: list[Any] | None, out: EnvOutput, active, responses, version):
        tracker.record_step(out, active, version)
        items: list[Any] = []
        self.turns_collected += len(active)
        if not self.yield_completed_trajectories:
            assert prompts is not None
            for i, response, prompt in zip(active, responses, prompts, strict=True):
                items.append(
                    DialogTurn(
                        prompt=prompt,
                        response=response,
                        reward=float(out.reward[i]),
                        reward_components=dict(out.reward_components[i]),
                        done=bool(out.done[i]),
                        turn=int(out.turn[i]),
                        policy_version=version,
                        prompt_id=out.prompt_id[i],
                        group_id=out.group_id[i],
                        sample_index=out.sample_index[i],
                    )
                )
        elif not out.active:
            trajectories = tracker.trajectories()
            self.trajectories_collected += len(trajectories)
            items.extend(trajectories)
        return items

    def _run_sync(self) -> Iterator[list[Any]]:
        tracker = _EnvTracker(self.envs[0])
        try:
            out = tracker.reset(self._next_prompts(tracker.env))
        except StopIteration:
            return
        while not self._finished():
            active = out.active
            if not active:
                try:
                    out = tracker.reset(self._next_prompts(tracker.env))
                except StopIteration:
                    return
                continue
            version = self.policy_version
            responses = self._generate(select_slots(out, active))
            actions: list[Any] = [None] * out.batch_size
            for i, response in zip(active, responses, strict=True):
                actions[i] = response
            prompts = self._snapshot(out, active)
            out = tracker.env.step(actions)
            yield self._finish_step(tracker, prompts, out, active, responses, version)

    def _run_async(self) -> Iterator[list[Any]]:
        trackers = [_EnvTracker(env) for env in self.envs]
        pool = ThreadPoolExecutor(max_workers=len(trackers), thread_name_prefix="llmrl-env")
        running: dict[Future, tuple[_EnvTracker, list[Any] | None, list[int], list[Any], int | str]] = {}
        ready: list[_EnvTracker] = []
        exhausted = False
        try:
            for tracker in trackers:
                try:
                    tracker.reset(self._next_prompts(tracker.env))
                    ready.append(tracker)
                except StopIteration:
                    exhausted = True
            while not self._finished() and (ready or running):
                to_generate = []
                for tracker in ready:
                    if tracker.out is not None and not tracker.out.active:
                        if exhausted:
                            continue
                        try:
                            tracker.reset(self._next_prompts(tracker.env))
                        except StopIteration:
                            exhausted = True
                            continue
                    to_generate.append(tracker)
                ready = []
                if to_generate:
                    # One policy call for every ready env: concatenate their active prompts.
                    parts = [(t, t.out.active) for t in to_generate]
                    merged = _concat([select_slots(t.out, idx) for t, idx in parts])
                    version = self.policy_version
                    responses = self._generate(merged)
                    offset = 0
                    for tracker, idx in parts:
                        chunk = responses[offset : offset + len(idx)]
                        offset += len(idx)
                        actions: list[Any] = [None] * tracker.out.batch_size
                        for i, response in zip(idx, chunk, strict=True):
                            actions[i] = response
                        future = pool.submit(tracker.env.step, actions)
                        running[future] = (tracker, self._snapshot(tracker.out, idx), idx, chunk, version)
                if not running:
                    break
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    tracker, prompts, idx, chunk, version = running.pop(future)
                    out = future.result()
                    ready.append(tracker)
                    yield self._finish_step(tracker, prompts, out, idx, chunk, version)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


def _concat(parts: list[LLMData]) -> LLMData:
    histories = [h for p in parts for h in p.history] if all(p.history is not None for p in parts) else None
    text = [t for p in parts for t in p.text] if all(p.text is not None for p in parts) else None
    tokens = [t for p in parts for t in p.tokens] if all(p.tokens is not None for p in parts) else None
    return LLMData(history=HistoryBatch(histories) if histories is not None else None, text=text, tokens=tokens)
