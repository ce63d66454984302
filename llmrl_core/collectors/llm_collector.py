"""``LLMCollector``: run chat environments with a policy and hand out trajectories or dialog turns.

Two schedules:

* **sync** (one batched env): every step generates for all active slots at once, then steps the env;
  a batch of slots is reset when all of its slots are done (or each slot on its own, see below).
* **async** (``async_envs=True``, a list of envs — typically one GRPO group per env): each env steps in
  its own thread, and the collector generates for whichever envs are ready. A slow tool call in one env
  (a sandboxed interpreter, an MCP server) holds up only that env; the others keep generating.

Resets: by default a batch of slots is reset only when all of its slots are done. With
``rolling_reset=True`` each slot is reset on its own (``ChatEnv.reset_slots``) as soon as its episode is done
and handed out, so one slot in a long multi-turn episode or a slow tool call does not hold back the others'
next prompts. That is what TorchRL's collector always does (``env.step_and_maybe_reset`` after every step);
here it is the default only for dialog turns of one fixed-size env (see below), so for whole episodes the batch
schedule (all slots of a GRPO group sampled in the same steps, with the same weights) stays the default. With a
total, rolling resets draw only the prompts still needed.

Every sampled turn can be stamped with the policy version current when it was sampled
(``track_policy_version``, off by default as in TorchRL; off stamps None). The version lives in a
:class:`~llmrl_core.envs.transforms.policy_version.PolicyVersion` (the env's own, if it has one), which
:meth:`LLMCollector.increment_version`, :meth:`LLMCollector.update_policy_weights_` or a ``vLLMUpdater`` it is
registered with advances.

Batches are TensorDicts in TorchRL's layout (:mod:`llmrl_core.collectors.tensordict_batches`): one row per
finished episode (``yield_completed_trajectories``) or per dialog turn (every sampled turn, or with
``yield_only_last_steps`` only the last turn of each finished episode). Dialog turns of one env with a fixed
batch size ``B`` come as TorchRL's collector hands them out: whole env steps, every slot answering at each step (a
finished slot is reset on its own at once), shaped ``(B, steps)`` (row ``b``: slot ``b``'s turns in order), or with
``flatten_data`` (TorchRL's default when a ``replay_buffer`` is given) viewed as ``(B * steps,)``. With a
``queue`` (anything with ``put``) or a ``replay_buffer`` (anything with ``extend``), every batch is also delivered
there. The policy is a TorchRL-style wrapper (:mod:`llmrl_core.modules`, TensorDict in and out) or a rollout
callable on :class:`~llmrl_core.data.llm_data.LLMData`. The items are cut into batches by
:class:`~llmrl_core.collectors.batch_assembly.BatchAssembly`.
"""

from __future__ import annotations

import queue as queue_module
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from llmrl_core.collectors.batch_assembly import BatchAssembly
from llmrl_core.collectors.env_tracker import EnvTracker, select_slots
from llmrl_core.collectors.policy_weights import PolicyWeights, Version
from llmrl_core.collectors.tensordict_batches import llm_data_to_tensordict, stack_rows, turn_row
from llmrl_core.data.conversation import ConversationBatch
from llmrl_core.data.llm_data import LLMData
from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.tensordict_io import active_rows, policy_row_fields, responses_from_tensordict
from llmrl_core.envs.transforms.policy_version import PolicyVersion

Policy = Callable[[LLMData], Any]


class LLMCollector(BatchAssembly, PolicyWeights):
    """Runs env(s) and a policy together; iterate it for batches (see the module docstring).

    ``policy`` is a wrapper from :mod:`llmrl_core.modules` (or any callable taking :class:`LLMData` and
    returning an object with ``responses()``). ``prompts`` optionally feeds resets from an iterable of
    rows (otherwise each env's primer does), ``prompts_per_reset`` at a time (default: the env's batch size;
    rolling resets take one row per freed slot). ``dialog_turns_per_batch`` sets the batch size in turns (in
    trajectory mode: at least that many turns of finished trajectories); ``total_dialog_turns`` (sampled
    turns) or ``total_trajectories`` (finished episodes) end the iteration.

    TorchRL's options: ``env`` may be a factory (TorchRL's ``create_env_fn``), ``policy_factory`` builds the policy
    (exactly one of ``policy``/``policy_factory``), ``queue`` (anything with ``put``) or ``replay_buffer``
    (anything with ``extend``) receives every batch (not both: RuntimeError), ``postproc`` maps each batch,
    ``total_dialog_turns=-1`` means no limit, ``flatten_data`` (default: True with a ``replay_buffer``) flattens
    ``(B, steps)`` dialog-turn batches, ``verbose``/``reset_at_each_iter`` are accepted.
    Items are dialog turns by default (TorchRL's ``yield_completed_trajectories=None``), whole episodes with
    ``yield_completed_trajectories=True`` or when a ``total_trajectories`` is given;
    ``yield_only_last_steps`` hands out only the last turn of each finished episode
    (``yield_completed_trajectories`` is then True, as in TorchRL; False is a TypeError).
    ``track_policy_version`` (default False, as TorchRL; an env's own ``PolicyVersion`` or a ``policy_version``
    given is used anyway): True stamps the version of the env's ``PolicyVersion``, else of a collector-owned one
    (unlike TorchRL, the collector never appends a ``PolicyVersion`` to the env: it stamps each row itself, so
    async envs work); a ``PolicyVersion`` is used as given; False stamps None.
    ``weight_updater`` (e.g. a ``vLLMUpdater``, any object with ``push_weights(weights)``, or a callable) is
    what :meth:`update_policy_weights_` pushes through. ``rolling_reset`` resets each finished slot on its own
    (see the module docstring); its default is on for dialog turns of one fixed-size env (TorchRL's
    ``step_and_maybe_reset``), off otherwise.
    """

    def __init__(
        self,
        env: ChatEnv | Sequence[ChatEnv] | Callable[[], ChatEnv],
        policy: Policy | None = None,
        *,
        policy_factory: Callable[[], Policy] | None = None,
        dialog_turns_per_batch: int | None = None,
        total_dialog_turns: int | None = -1,
        total_trajectories: int | None = None,
        yield_completed_trajectories: bool | None = None,
        yield_only_last_steps: bool | None = None,
        prompts: Iterable[Any] | None = None,
        prompts_per_reset: int | None = None,
        sink: Any = None,
        replay_buffer: Any = None,
        queue: Any = None,
        postproc: Callable[[list[Any]], Any] | None = None,
        reset_at_each_iter: bool = False,
        flatten_data: bool | None = None,
        verbose: bool = False,
        policy_version: PolicyVersion | None = None,
        track_policy_version: bool | PolicyVersion = False,
        weight_updater: Any = None,
        rolling_reset: bool | None = None,
        async_envs: bool | None = None,
    ) -> None:
        if queue is not None and replay_buffer is not None:
            raise RuntimeError("Handling both a buffer and a queue is not possible at the moment.")
        if yield_only_last_steps and yield_completed_trajectories is False:
            raise TypeError("yield_only_last_steps=True requires yield_completed_trajectories=True (or None)")
        if yield_only_last_steps and flatten_data is not None:
            raise TypeError("`yield_only_last_steps` cannot be `True` when `flatten_data` is passed.")
        if yield_only_last_steps and reset_at_each_iter:
            raise TypeError("`yield_only_last_steps` cannot be `True` when `reset_at_each_iter=True`.")
        if (policy is None) == (policy_factory is None):
            raise TypeError("LLMCollector needs exactly one of policy and policy_factory")
        if sink is not None and (queue is not None or replay_buffer is not None):
            raise ValueError("sink is llmrl's name for queue/replay_buffer: pass only one of them")
        policy = policy if policy is not None else policy_factory()
        if callable(env) and not isinstance(env, ChatEnv | Sequence):
            env = env()  # TorchRL's create_env_fn
        async_envs = bool(async_envs)
        total_dialog_turns = None if total_dialog_turns is not None and total_dialog_turns < 0 else total_dialog_turns
        self.postproc = postproc
        self.reset_at_each_iter = reset_at_each_iter
        self.flatten_data = replay_buffer is not None if flatten_data is None else flatten_data  # TorchRL's default
        self.verbose = verbose
        sink = sink if sink is not None else (queue if queue is not None else replay_buffer)
        self.envs = list(env) if isinstance(env, Sequence) else [env]
        if not self.envs:
            raise ValueError("LLMCollector needs at least one env")
        if not async_envs and len(self.envs) != 1:
            raise ValueError("several envs need async_envs=True (the sync collector steps one batched env)")
        self.policy = policy
        self.async_envs = async_envs
        self.yield_only_last_steps = bool(yield_only_last_steps)
        if yield_completed_trajectories is None:  # TorchRL: dialog turns unless only last steps are asked for;
            # llmrl: a total counted in trajectories asks for whole episodes
            yield_completed_trajectories = yield_only_last_steps or total_trajectories is not None
        self.yield_completed_trajectories = yield_completed_trajectories
        # What the items are: whole trajectories, or dialog turns (all, or the last of each episode).
        self._yield_trajectories = yield_completed_trajectories and not yield_only_last_steps
        # TorchRL's dialog-turn batches: whole env steps, (batch, steps) or flattened slot by slot. Needs one env
        # of a fixed batch size whose slots all answer at every step: a finished slot is reset on its own at once.
        self._step_layout = (
            not self._yield_trajectories
            and not self.yield_only_last_steps
            and not async_envs
            and self.envs[0].num_slots is not None
        )
        self.rolling_reset = self._step_layout if rolling_reset is None else rolling_reset
        self.dialog_turns_per_batch = dialog_turns_per_batch
        self.total_dialog_turns = total_dialog_turns
        self.total_trajectories = total_trajectories
        self.sink = sink
        self._prompts = iter(prompts) if prompts is not None else None
        self.prompts_per_reset = prompts_per_reset
        self._prompt_lock = threading.Lock()
        self.version_tracker: PolicyVersion | None = self._resolve_version_tracker(policy_version, track_policy_version)
        self.weight_updater: Any = None
        self._updater_increments = False
        if weight_updater is not None:
            self.set_weight_updater(weight_updater)
        self.turns_collected = 0
        self.trajectories_collected = 0
        self.episodes_started = 0
        # as TorchRL's collectors: the env and the policy know their collector (RetrieveKL(gen_model="from_collector"))
        for owner in (*self.envs, self.policy):
            register = getattr(owner, "register_collector", None)
            if register is not None:
                register(self)

    def set_postproc(self, postproc: Callable[[Any], Any]) -> None:
        """Set the function every batch goes through before it is handed out (once: TorchRL's rule)."""
        if self.postproc is not None:
            raise RuntimeError("Postproc already set")
        self.postproc = postproc

    def get_policy_model(self) -> Policy:
        """The policy this collector samples with (TorchRL's accessor)."""
        return self.policy

    # --- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[TensorDictBase]:
        for units in self._item_batches():
            batch = self._to_tensordict(units)
            batch = self.postproc(batch) if self.postproc is not None else batch
            self._deliver(batch)
            yield batch

    def collect(self) -> TensorDictBase:
        """Run to the configured total and return everything as one TensorDict of rows (needs a total)."""
        if self.total_dialog_turns is None and self.total_trajectories is None:
            raise ValueError("collect() needs total_dialog_turns or total_trajectories")
        flat = (batch.view(-1) if batch.batch_dims > 1 else batch for batch in self)
        rows = [batch[i] for batch in flat for i in range(batch.batch_size[0])]
        return stack_rows(rows)

    def _deliver(self, batch: list[Any]) -> None:
        if self.sink is None:
            return
        if isinstance(self.sink, queue_module.Queue) or not callable(getattr(self.sink, "extend", None)):
            self.sink.put(batch)  # a queue (any object with put), TorchRL's ``queue``
        else:
            self.sink.extend(batch)

    def _finished(self) -> bool:
        if self.total_dialog_turns is not None and self.turns_collected >= self.total_dialog_turns:
            return True
        return self.total_trajectories is not None and self.trajectories_collected >= self.total_trajectories

    def _episodes_left(self) -> int | None:
        """Rolling resets: how many more episodes the totals can still use (None: no limit known)."""
        if self.total_trajectories is not None:
            return max(0, self.total_trajectories - self.episodes_started)
        return None

    def _take_prompts(self, size: int) -> list[Any]:
        assert self._prompts is not None
        with self._prompt_lock:
            # zip stops on the range first, so no row beyond ``size`` is pulled from the iterator
            return [row for _, row in zip(range(size), self._prompts, strict=False)]

    def _next_prompts(self, env: ChatEnv) -> list[Any] | None:
        if self._prompts is None:
            return None
        size = self.prompts_per_reset or env.num_slots or 1
        left = self._episodes_left()
        if self.rolling_reset and env.num_slots is None and left is not None:
            size = min(size, max(left, 1))
        rows = self._take_prompts(size)
        if not rows:
            raise StopIteration
        return rows

    def _start(self, tracker: EnvTracker) -> TensorDictBase:
        """Full reset of one env (raises StopIteration when the prompts ran out)."""
        out = tracker.reset(self._next_prompts(tracker.env))
        self.episodes_started += tracker.size
        return out

    def _refill(self, tracker: EnvTracker, finished: list[int]) -> None:
        """Rolling reset: the slots that just finished take the next prompts, as many as are still needed."""
        if not finished or self._finished():
            return
        n = len(finished)
        left = self._episodes_left()
        if left is not None:
            n = min(n, left)
        if self.total_dialog_turns is not None and tracker.out is not None:
            # every new episode takes at least one turn; the running ones already take one each next step
            n = min(n, self.total_dialog_turns - self.turns_collected - len(tracker.active))
        if n <= 0:
            return
        rows = None
        if self._prompts is not None:
            rows = self._take_prompts(n)
            n = len(rows)
            if n == 0:
                return
        tracker.reset_slots(finished[:n], rows)
        self.episodes_started += n

    # --- producing items -------------------------------------------------------------------------
    def _generate(self, data: LLMData) -> list[Any]:
        if isinstance(self.policy, TensorDictModuleBase):  # a TorchRL-style wrapper: TensorDict in, out
            out = self.policy(llm_data_to_tensordict(data, getattr(self.policy, "input_mode", None)))
            responses = responses_from_tensordict(out, getattr(self.policy, "tokenizer", None), text_first=True)
            # the prompt/full ids and masks a dialog-turn row carries
            for response, fields in zip(responses, policy_row_fields(out), strict=True):
                response.policy_fields = fields
            return responses
        return self.policy(data).responses()

    def _snapshot(self, tracker: EnvTracker, active: Sequence[int]) -> list[Any] | None:
        """Copies of the prompts about to be answered (the env mutates its conversations in ``step``: taken before
        it), with their token ids in tokens mode."""
        if self._yield_trajectories:
            return None
        assert tracker.out is not None
        tokens = LLMData.from_tensordict(tracker.out, with_history=False).tokens
        slots = tracker.env.slots
        return [(slots[i].history.copy(), tokens[i] if tokens is not None else None) for i in active]

    def _cap(self, items: list[Any]) -> list[Any]:
        """Rolling resets: never hand out more finished episodes than ``total_trajectories``."""
        if self.rolling_reset and self.total_trajectories is not None:
            return items[: max(0, self.total_trajectories - self.trajectories_collected)]
        return items

    def _finish_step(
        self,
        tracker: EnvTracker,
        prompts: list[Any] | None,
        out: TensorDictBase,
        active: list[int],
        responses: list[Any],
        version: Version,
    ) -> tuple[list[Any], list[int]]:
        """Record a step; returns the items to hand out and the slots whose episode just finished."""
        tracker.record_step(out, active, version)
        items: list[Any] = []
        self.turns_collected += len(active)
        done = out.get("done").reshape(-1).tolist()
        finished = [i for i in active if done[i]]
        if not self._yield_trajectories:
            assert prompts is not None
            slots = tracker.env.slots
            layout = tracker.env.step_layout(slots)
            reward = out.get("reward").reshape(-1).tolist()
            for i, response, (prompt, prompt_tokens) in zip(active, responses, prompts, strict=True):
                if self.yield_only_last_steps and not done[i]:
                    continue
                slot = slots[i]
                items.append(
                    turn_row(
                        prompt,
                        response,
                        prompt_tokens=prompt_tokens,
                        reward=reward[i],
                        reward_components=dict(slot.reward_components),
                        done=done[i],
                        turn=slot.turn,
                        policy_version=version,
                        prompt_id=slot.prompt_id,
                        group_id=slot.group_id,
                        sample_index=slot.sample_index,
                        data=slot.data,
                        next_fields=slot.next_fields,
                        step_layout=layout,
                    )
                )
            if self.yield_only_last_steps:
                items = self._cap(items)
            self.trajectories_collected += len(finished)
        elif self.rolling_reset:
            trajectories = self._cap(tracker.trajectories(finished))
            self.trajectories_collected += len(trajectories)
            items.extend(trajectories)
        elif not active_rows(out):
            trajectories = tracker.trajectories()
            self.trajectories_collected += len(trajectories)
            items.extend(trajectories)
        return items, finished

    def _run_sync(self) -> Iterator[list[Any]]:
        tracker = EnvTracker(self.envs[0])
        try:
            out = self._start(tracker)
        except StopIteration:
            return
        while not self._finished():
            active = active_rows(out)
            if not active:
                if self.rolling_reset:
                    return  # every slot is done and none could take a new prompt
                try:
                    out = self._start(tracker)
                except StopIteration:
                    return
                continue
            version = self.policy_version
            responses = self._generate(select_slots(tracker.env, out, active))
            actions: list[Any] = [None] * tracker.size
            for i, response in zip(active, responses, strict=True):
                actions[i] = response
            prompts = self._snapshot(tracker, active)
            out = tracker.env.step(actions)
            items, finished = self._finish_step(tracker, prompts, out, active, responses, version)
            yield items
            if self.rolling_reset:
                # the finished episodes were handed out above: their slots alone take the next prompts
                self._refill(tracker, finished)
                assert tracker.out is not None
                out = tracker.out

    def _run_async(self) -> Iterator[list[Any]]:
        trackers = [EnvTracker(env) for env in self.envs]
        pool = ThreadPoolExecutor(max_workers=len(trackers), thread_name_prefix="llmrl-env")
        running: dict[Future, tuple[EnvTracker, list[Any] | None, list[int], list[Any], Version]] = {}
        ready: list[EnvTracker] = []
        exhausted = False
        try:
            for tracker in trackers:
                if self.rolling_reset and self._episodes_left() == 0:
                    break
                try:
                    self._start(tracker)
                    ready.append(tracker)
                except StopIteration:
                    exhausted = True
            while not self._finished() and (ready or running):
                to_generate = []
                for tracker in ready:
                    if tracker.out is not None and not tracker.active:
                        if exhausted or self.rolling_reset:
                            continue
                        try:
                            self._start(tracker)
                        except StopIteration:
                            exhausted = True
                            continue
                    to_generate.append(tracker)
                ready = []
                if to_generate:
                    # One policy call for every ready env: concatenate their active prompts.
                    parts = [(t, t.active) for t in to_generate]
                    merged = _concat([select_slots(t.env, t.out, idx) for t, idx in parts])
                    version = self.policy_version
                    responses = self._generate(merged)
                    offset = 0
                    for tracker, idx in parts:
                        chunk = responses[offset : offset + len(idx)]
                        offset += len(idx)
                        actions: list[Any] = [None] * tracker.size
                        for i, response in zip(idx, chunk, strict=True):
                            actions[i] = response
                        prompts = self._snapshot(tracker, idx)  # before the step changes the conversations
                        future = pool.submit(tracker.env.step, actions)
                        running[future] = (tracker, prompts, idx, chunk, version)
                if not running:
                    break
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    tracker, prompts, idx, chunk, version = running.pop(future)
                    out = future.result()
                    ready.append(tracker)
                    items, finished = self._finish_step(tracker, prompts, out, idx, chunk, version)
                    yield items
                    if self.rolling_reset:
                        self._refill(tracker, finished)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


def _concat(parts: list[LLMData]) -> LLMData:
    histories = [h for p in parts for h in p.history] if all(p.history is not None for p in parts) else None
    text = [t for p in parts for t in p.text] if all(p.text is not None for p in parts) else None
    tokens = [t for p in parts for t in p.tokens] if all(p.tokens is not None for p in parts) else None
    return LLMData(history=ConversationBatch(histories) if histories is not None else None, text=text, tokens=tokens)
