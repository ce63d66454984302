"""LLMCollector (sync and async) on the packaged model, and its scheduling options with a scripted policy."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import torch

from llmrl_core.collectors import LLMCollector
from llmrl_core.collectors.tensordict_batches import EpisodeRow
from llmrl_core.collectors.tensordict_batches import rows as episodes
from llmrl_core.data import LLMData
from llmrl_core.data.tensor_specs import Unbounded
from llmrl_core.envs import ChatEnv, PolicyVersion, Transform, make_gsm8k_env
from llmrl_core.envs.tensordict_io import end_rows, step_row_fields
from llmrl_core.modules import vLLMWrapper


@pytest.fixture(scope="module")
def policy(vllm_engine_fp32):
    return vLLMWrapper(vllm_engine_fp32, generate_kwargs={"max_new_tokens": 24, "temperature": 0.8, "seed": 0})


def _gsm8k_env(tokenizer, batch_size=2, repeats=2, input_mode="history"):
    return make_gsm8k_env(
        batch_size=batch_size, repeats=repeats, group_repeats=True, tokenizer=tokenizer, input_mode=input_mode, seed=0
    )


def test_sync_collector_yields_trajectories_and_stamps_versions(policy):
    env = _gsm8k_env(policy.tokenizer, input_mode="tokens")
    version = PolicyVersion()
    env.append_transform(version)
    collector = LLMCollector(env, policy, total_trajectories=8)
    assert collector.version_tracker is version  # the env's own PolicyVersion is used
    batches = []
    for batch in collector:
        batches.append(batch)
        collector.increment_version()
    assert [len(b) for b in batches] == [4, 4]
    for expected_version, batch in enumerate(batches):
        assert batch["policy_version"].tolist() == [expected_version] * 4  # TorchRL's key, a tensor per row
        assert batch.get(("history", "full"))[0].role[0] == "system"
        sampled_rows = batch.get(("tokens", "response"), as_list=True)
        batch = episodes(batch)
        assert all(isinstance(t, EpisodeRow) for t in batch)
        assert all(t.policy_versions == [expected_version] for t in batch)
        # one GRPO group per prompt: 2 prompts x 2 copies, copies share the group id and the prompt
        groups = {}
        for t in batch:
            groups.setdefault(t.group_id, []).append(t)
        assert sorted(len(g) for g in groups.values()) == [2, 2]
        for members in groups.values():
            assert len({m.messages[1]["content"] for m in members}) == 1
        for t, response in zip(batch, sampled_rows, strict=True):
            assert t.reward in (0.0, 0.1, 1.0)
            assert t.terminated or t.truncated
            assert t.num_turns == 1 and t.finish_reason in {"stop", "length"}
            # tokens mode: the exact sampled ids sit inside the trajectory tokens, under the policy mask,
            # with one sampler log-prob each
            assert t.tokens[t.policy_mask].tolist() == response[response.ne(-1)].tolist()
            assert len(t.sampler_log_probs) == int(t.policy_mask.sum()) == t.num_sampled_tokens
    assert version.version == 2


def test_dialog_turn_batches_and_sink(policy):
    env = ChatEnv(tokenizer=policy.tokenizer, max_turns=2, batch_size=3)
    sink: queue.Queue = queue.Queue()
    prompts = [{"query": q} for q in ["Hi!", "Name a fruit.", "What is 1+1?"] * 2]
    collector = LLMCollector(
        env,
        policy,
        prompts=prompts,
        yield_completed_trajectories=False,
        dialog_turns_per_batch=4,
        total_dialog_turns=12,
        sink=sink,
    )
    batches = list(collector)
    # TorchRL's layout: whole env steps (4 turns asked, 3 slots: 2 steps), shaped (slots, steps)
    assert [b.batch_size for b in batches] == [(3, 2), (3, 2)]
    turns = [b[i, j] for b in batches for i in range(3) for j in range(2)]
    assert all(t["reward"].shape == (1,) and t.get(("tokens", "response")).dtype == torch.long for t in turns)
    for b in batches:  # row i is slot i's conversation: its second turn's prompt holds its first answer
        assert [b[i, j]["turn"] for i in range(3) for j in range(2)] == [1, 2] * 3
        for i in range(3):
            assert list(b[i, 1]["history"].prompt.role) == ["user", "assistant"]
            assert b[i, 1]["history"].prompt.content[-1].strip() == b[i, 0]["text"].response.strip()
            assert b[i, 1]["history"].prompt.content[0] == b[i, 0]["history"].prompt.content[0]
    assert sorted(b[i, 0]["query"] for b in batches for i in range(3)) == sorted(p["query"] for p in prompts)
    assert sink.qsize() == 2 and sink.get() is batches[0]


def test_flatten_data_views_the_dialog_turn_batch_slot_after_slot():
    """flatten_data=True (TorchRL's default with a replay buffer) hands out ``(slots * steps,)``: slot 0's turns,
    then slot 1's; a partial last step (the prompts ran out) makes a flat batch, step after step."""
    env, _ = _scripted_env(batch_size=2)
    rows = [{"query": "a", "turns": 2}, {"query": "b", "turns": 1}, {"query": "c"}]

    class Buffer(list):
        def extend(self, batch):  # a replay buffer: anything with extend
            self.append(batch)

    buffer = Buffer()
    collector = LLMCollector(env, scripted_policy, prompts=rows, dialog_turns_per_batch=4, replay_buffer=buffer)
    assert collector.flatten_data is True and collector.rolling_reset is True
    batches = list(collector)
    assert batches[0].batch_size == (4,) and buffer == batches
    # slot 0 plays "a" for two turns; slot 1 plays "b" and, reset on its own at once, "c"
    assert [(t["query"], t["turn"]) for t in batches[0]] == [("a", 1), ("a", 2), ("b", 1), ("c", 1)]
    unflat = list(LLMCollector(_scripted_env(batch_size=2)[0], scripted_policy, prompts=rows, dialog_turns_per_batch=4))
    assert collector.flatten_data is True and len(unflat) == 1
    assert unflat[0].batch_size == (2, 2) and [unflat[0][1, j]["query"] for j in range(2)] == ["b", "c"]
    # no prompt left for slot 1 after its first step: the second step is slot 0's alone, a flat batch
    partial = list(LLMCollector(_scripted_env(batch_size=2)[0], scripted_policy, prompts=rows[:2]))
    assert [b.batch_size for b in partial] == [(2, 1), (1,)] and partial[1][0]["turn"] == 2


class _Rewards(Transform):
    """A transform that may reward: its reward spec declares ``reward`` (so a step's data carries one)."""

    def transform_reward_spec(self, reward_spec):
        reward_spec["reward"] = Unbounded(shape=(*reward_spec.shape, 1))
        return reward_spec

    def _pay(self, next_tensordict, paid: list[float], name: str) -> None:
        """Add ``paid`` per row (the reward part ``name``) and end the rows paid."""
        for i, value in enumerate(paid):
            if value:
                self._note_row(i, reward_components={name: value})
        reward = next_tensordict["reward"]
        next_tensordict.set("reward", reward + torch.tensor(paid, dtype=reward.dtype).reshape(reward.shape))
        end_rows(next_tensordict, [bool(value) for value in paid])


class StuckTool(_Rewards):
    """A tool that hangs (until released) for conversations whose query says "stuck"."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def _step(self, tensordict, next_tensordict):
        rows = step_row_fields(tensordict, next_tensordict)
        if any("stuck" in (row.get("query") or "") for row in rows):
            self.release.wait(timeout=300)
        self._pay(next_tensordict, [1.0] * len(rows), "done")
        return next_tensordict


def test_async_collector_finishes_while_one_env_is_stuck_in_a_tool(policy):
    release = threading.Event()
    envs = []
    for _ in range(3):
        env = ChatEnv(tokenizer=policy.tokenizer, batch_size=1, max_turns=1)
        env.append_transform(StuckTool(release))
        envs.append(env)
    prompts = [{"query": "You are stuck in a tool."}] + [{"query": f"Say the number {i}."} for i in range(4)]
    collector = LLMCollector(
        envs, policy, prompts=prompts, async_envs=True, total_trajectories=4, track_policy_version=True
    )
    start = time.monotonic()
    try:
        trajectories = episodes(collector.collect())
    finally:
        release.set()
    assert time.monotonic() - start < 240
    assert len(trajectories) == 4
    assert all("stuck" not in t.data["query"] for t in trajectories)
    assert sorted(t.data["query"] for t in trajectories) == [f"Say the number {i}." for i in range(4)]
    assert all(t.reward == 1.0 and t.policy_version == 0 for t in trajectories)


def test_collector_argument_errors(policy):
    env = ChatEnv(tokenizer=policy.tokenizer)
    with pytest.raises(ValueError, match="async_envs=True"):
        LLMCollector([env, env], policy)
    with pytest.raises(ValueError, match="needs total_dialog_turns or total_trajectories"):
        LLMCollector(env, policy).collect()


# --- scripted policy: per-slot (rolling) resets, TorchRL's collector options -----------------------------------
def scripted_policy(data: LLMData) -> LLMData:
    """Answers every prompt with 'ok' (no model): the env's transforms decide how long an episode lasts."""
    return LLMData(text_response=["ok"] * data.batch_size, finish_reasons=["stop"] * data.batch_size)


class EpisodeLength(_Rewards):
    """Ends an episode after its row's ``turns`` answers (default 1), paying that count, and logs starts, ends and
    env steps."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []
        self.steps = 0

    def _reset(self, tensordict, tensordict_reset):
        rows = step_row_fields(tensordict_reset, tensordict_reset)
        self.events.extend(("start", rows[i]["query"]) for i in self._reset_rows(tensordict, tensordict_reset))
        return tensordict_reset

    def _step(self, tensordict, next_tensordict):
        self.steps += 1
        rows = step_row_fields(tensordict, next_tensordict)
        chats = next_tensordict["history"].prompt.to_conversations()
        paid = []
        for chat, row in zip(chats, rows, strict=True):
            turns = sum(m.role == "assistant" for m in chat.messages)
            ended = turns >= (row.get("turns") or 1)
            paid.append(float(turns) if ended else 0.0)
            if ended:
                self.events.append(("end", row["query"]))
        self._pay(next_tensordict, paid, "turns")
        return next_tensordict


def _counted(rows: list[dict], drawn: list[str]):
    for row in rows:
        drawn.append(row["query"])
        yield row


def _long_and_short(n_short: int = 9) -> list[dict]:
    return [{"query": "long", "turns": 6}] + [{"query": f"q{i}"} for i in range(1, n_short + 1)]


def _scripted_env(batch_size: int = 2) -> tuple[ChatEnv, EpisodeLength]:
    lengths = EpisodeLength()
    env = ChatEnv(batch_size=batch_size, chat_template_name="chatml", max_turns=20).append_transform(lengths)
    return env, lengths


def test_rolling_reset_lets_other_slots_take_new_prompts_during_a_long_episode():
    env, lengths = _scripted_env()
    drawn: list[str] = []
    collector = LLMCollector(
        env, scripted_policy, prompts=_counted(_long_and_short(), drawn), total_trajectories=6, rolling_reset=True
    )
    trajectories = episodes(collector.collect())
    # slot 1 ran q1..q5 one after the other while slot 0 was still in its 6-turn episode
    assert [t.data["query"] for t in trajectories] == ["q1", "q2", "q3", "q4", "q5", "long"]
    assert lengths.events == [("start", "long"), ("start", "q1")] + [
        e for i in range(1, 5) for e in (("end", f"q{i}"), ("start", f"q{i + 1}"))
    ] + [("end", "q5"), ("end", "long")]
    assert lengths.steps == 6  # the long episode's 6 turns: the short ones fitted alongside it
    assert drawn == ["long", "q1", "q2", "q3", "q4", "q5"]  # exactly total_trajectories prompts drawn
    assert [t.num_turns for t in trajectories] == [1] * 5 + [6] and trajectories[-1].reward == 6.0
    assert collector.trajectories_collected == 6 and collector.episodes_started == 6

    # the default (TorchRL's batch schedule kept): the next pair waits until the long episode is over
    env, lengths = _scripted_env()
    batch_mode = episodes(LLMCollector(env, scripted_policy, prompts=_long_and_short(), total_trajectories=6).collect())
    assert [t.data["query"] for t in batch_mode] == ["long", "q1", "q2", "q3", "q4", "q5"]
    assert lengths.steps == 8 and lengths.events.index(("start", "q2")) > lengths.events.index(("end", "long"))


def test_rolling_reset_draws_only_the_prompts_it_needs():
    env, lengths = _scripted_env(batch_size=3)
    drawn: list[str] = []
    rows = [{"query": f"q{i}", "turns": 1 + i % 2} for i in range(10)]
    collector = LLMCollector(
        env, scripted_policy, prompts=_counted(rows, drawn), total_trajectories=4, rolling_reset=True
    )
    batches = list(collector)
    trajectories = [t for b in batches for t in episodes(b)]
    assert len(trajectories) == 4 and drawn == ["q0", "q1", "q2", "q3"]
    assert sorted(t.data["query"] for t in trajectories) == ["q0", "q1", "q2", "q3"]
    # the prompts run out before the total: the collector ends when the last running episode ends
    env, _ = _scripted_env(batch_size=2)
    short = episodes(
        LLMCollector(env, scripted_policy, prompts=rows[:3], total_trajectories=10, rolling_reset=True).collect()
    )
    assert sorted(t.data["query"] for t in short) == ["q0", "q1", "q2"]
    # total_dialog_turns: no new episode is started for turns that will not be collected
    env, _ = _scripted_env(batch_size=2)
    drawn = []
    turns = LLMCollector(
        env,
        scripted_policy,
        prompts=_counted([{"query": f"t{i}"} for i in range(10)], drawn),
        yield_completed_trajectories=False,
        total_dialog_turns=5,
        rolling_reset=True,
    ).collect()
    assert len(turns) == 5 and drawn == [f"t{i}" for i in range(5)]  # the last step samples one slot


def test_rolling_reset_with_the_env_primer_keeps_group_ids():
    from llmrl_core.envs import DatasetChatEnv

    rows = [{"id": f"p{i}", "query": f"question {i}", "turns": 3 if i == 0 else 1} for i in range(8)]
    env = DatasetChatEnv(rows, batch_size=1, repeats=2, group_repeats=True, shuffle=False, max_turns=None)
    lengths = EpisodeLength()
    env.append_transform(lengths)
    trajectories = episodes(LLMCollector(env, scripted_policy, total_trajectories=6, rolling_reset=True).collect())
    assert [(t.prompt_id, t.group_id, t.sample_index) for t in trajectories] == [
        ("p0", 0, 0),  # both copies of p0 take 3 turns and finish together
        ("p0", 0, 1),
        ("p1", 1, 0),
        ("p1", 1, 1),
        ("p2", 2, 0),
        ("p2", 2, 1),
    ]
    assert lengths.steps == 5


def test_rolling_reset_with_async_envs():
    envs, all_lengths = zip(*(_scripted_env(batch_size=2) for _ in range(2)), strict=True)
    drawn: list[str] = []
    rows = [{"query": f"q{i}", "turns": 1 + i % 3} for i in range(20)]
    collector = LLMCollector(
        list(envs),
        scripted_policy,
        prompts=_counted(rows, drawn),
        total_trajectories=7,
        rolling_reset=True,
        async_envs=True,
    )
    trajectories = episodes(collector.collect())
    assert len(trajectories) == 7 and len(drawn) == 7
    assert sorted(t.data["query"] for t in trajectories) == sorted(drawn)
    assert sum(len([e for e in lengths.events if e[0] == "start"]) for lengths in all_lengths) == 7


def test_yield_only_last_steps_hands_out_the_last_turn_of_each_episode():
    env, _ = _scripted_env(batch_size=2)
    rows = [{"query": f"q{i}", "turns": i + 1} for i in range(4)]
    collector = LLMCollector(env, scripted_policy, prompts=rows, yield_only_last_steps=True, total_trajectories=4)
    assert collector.yield_completed_trajectories is True  # TorchRL: None follows yield_only_last_steps
    batch = collector.collect()
    turns = [batch[i] for i in range(len(batch))]
    assert batch["done"].all() and batch["done"].shape == (4, 1)
    assert sorted((t["history"].prompt.content[0], t["turn"]) for t in turns) == [
        ("q0", 1),
        ("q1", 2),
        ("q2", 3),
        ("q3", 4),
    ]
    assert sorted(batch["reward"].reshape(-1).tolist()) == [1.0, 2.0, 3.0, 4.0]  # the last step's reward
    assert collector.turns_collected == 1 + 2 + 3 + 4  # every sampled turn counts toward total_dialog_turns
    # TorchRL's combination (yield_completed_trajectories=True with it) gives the same items; batches count items
    env, _ = _scripted_env(batch_size=2)
    batches = list(
        LLMCollector(
            env,
            scripted_policy,
            prompts=rows,
            yield_only_last_steps=True,
            yield_completed_trajectories=True,
            dialog_turns_per_batch=1,
            rolling_reset=True,
        )
    )
    assert [len(b) for b in batches] == [1, 1, 1, 1] and [b[0]["turn"] for b in batches] == [1, 2, 3, 4]


def test_track_policy_version_options():
    rows = [{"query": f"q{i}"} for i in range(4)]
    env, _ = _scripted_env()
    off = LLMCollector(env, scripted_policy, prompts=rows, track_policy_version=False, total_trajectories=4)
    assert off.get_policy_version() is None and off.increment_version() is None
    untracked = off.collect()
    assert "policy_version" not in untracked.keys()  # TorchRL writes the key only when versions are tracked
    assert all(t.policy_versions == [None] and t.policy_version is None for t in episodes(untracked))

    env, _ = _scripted_env()
    on = LLMCollector(env, scripted_policy, prompts=rows, total_trajectories=4, track_policy_version=True)
    assert on.get_policy_version() == 0 and not any(isinstance(t, PolicyVersion) for t in env.td_transforms)
    stamped = []
    for batch in on:
        stamped += batch["policy_version"].tolist()
        on.increment_version()
    assert stamped == [0, 0, 1, 1] and on.get_policy_version() == 2

    custom = PolicyVersion("uuid")
    env, _ = _scripted_env()
    uid = LLMCollector(env, scripted_policy, prompts=rows, total_trajectories=2, track_policy_version=custom)
    assert uid.policy_version_tracker is custom
    assert set(uid.collect()["policy_version"]) == {custom.version}  # a uuid version: a string per row
    env, _ = _scripted_env()
    with pytest.raises(ValueError, match="two different PolicyVersions"):
        LLMCollector(env, scripted_policy, policy_version=PolicyVersion(), track_policy_version=custom)
    given = PolicyVersion()
    assert LLMCollector(env, scripted_policy, policy_version=given).policy_version_tracker is given


def test_the_collector_registers_with_its_env_and_they_still_pickle():
    """TorchRL's ``register_collector``: the collector's env knows it (``env.collector``, which
    ``RetrieveKL(gen_model="from_collector")`` reads); the reference is weak and left out of a pickled env."""
    import pickle

    env, _ = _scripted_env()
    assert env.collector is None
    collector = LLMCollector(env, scripted_policy, dialog_turns_per_batch=1)
    assert env.collector is collector
    copy = pickle.loads(pickle.dumps(env))
    assert copy.collector is None and env.collector is collector
    del collector
    assert env.collector is None  # a weak reference: the env does not keep its collector alive


def test_torchrl_arguments_and_errors():
    rows = [{"query": f"q{i}"} for i in range(4)]
    env, _ = _scripted_env()
    with pytest.raises(RuntimeError, match="both a buffer and a queue"):
        LLMCollector(env, scripted_policy, queue=queue.Queue(), replay_buffer=[], dialog_turns_per_batch=1)
    with pytest.raises(TypeError, match="yield_only_last_steps=True requires"):
        LLMCollector(env, scripted_policy, yield_only_last_steps=True, yield_completed_trajectories=False)
    with pytest.raises(TypeError, match="exactly one of policy and policy_factory"):
        LLMCollector(env, scripted_policy, policy_factory=lambda: scripted_policy)
    assert LLMCollector(env, scripted_policy).get_policy_version() is None  # TorchRL: track_policy_version=False
    seen = queue.Queue()
    collector = LLMCollector(
        lambda: _scripted_env()[0],
        policy_factory=lambda: scripted_policy,
        prompts=rows,
        total_trajectories=4,
        dialog_turns_per_batch=2,
        queue=seen,
        postproc=lambda batch: batch["reward"].reshape(-1).tolist(),
        verbose=True,
        flatten_data=False,
    )
    assert collector.get_policy_model() is scripted_policy
    batches = list(collector)
    assert all(isinstance(r, float) for b in batches for r in b) and sum(len(b) for b in batches) == 4
    assert [seen.get_nowait() for _ in batches] == batches


class RecordingUpdater:
    """Stands in for a vLLMUpdater: records every push and increments its registered version trackers."""

    def __init__(self) -> None:
        self.pushed: list[dict] = []
        self.trackers: list[PolicyVersion] = []

    def register_version_tracker(self, tracker: PolicyVersion) -> RecordingUpdater:
        self.trackers.append(tracker)
        return self

    def push_weights(self, weights) -> int:
        self.pushed.append(dict(weights))
        for tracker in self.trackers:
            tracker.increment_version()
        return len(self.pushed)


def test_update_policy_weights_pushes_through_the_weight_updater():
    import torch

    env, _ = _scripted_env()
    updater = RecordingUpdater()
    collector = LLMCollector(
        env,
        scripted_policy,
        prompts=[{"query": f"q{i}"} for i in range(6)],
        total_trajectories=6,
        weight_updater=updater,
        track_policy_version=True,
    )
    assert updater.trackers == [collector.version_tracker]  # registered once: one increment per push
    versions = []
    for step, batch in enumerate(collector):
        versions.append(batch["policy_version"].tolist())
        assert collector.update_policy_weights_({"w": torch.full((2,), float(step))}) == step + 1
    assert versions == [[0, 0], [1, 1], [2, 2]]
    assert [p["w"].tolist() for p in updater.pushed] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert collector.get_policy_version() == 3

    calls: list = []
    plain = LLMCollector(env, scripted_policy, weight_updater=calls.append, track_policy_version=True)
    assert plain.update_policy_weights_(state_dict={"w": 1}) == 1 and calls == [{"w": 1}]  # TorchRL's keyword
    local = LLMCollector(env, scripted_policy, track_policy_version=True)  # no updater: the version advances
    assert local.update_policy_weights_() == 1
    with pytest.raises(ValueError, match="needs a weight_updater"):
        local.update_policy_weights_({"w": 1})
    with pytest.raises(TypeError, match="push_weights"):
        LLMCollector(env, scripted_policy, weight_updater=object())


def test_a_torchrl_wrapper_in_history_mode_answers_with_its_own_text(hf_model_fp32):
    """A TorchRL-style policy (``TransformersWrapper``, history mode) returns a lazily stacked TensorDict: its
    sampled texts become the conversations' answers as they are (they once arrived as "NonTensorData(data=...)").
    Greedy decoding, so the wrapper called by hand on the same prompts gives the expected answers."""
    from tensordict import TensorDict

    from llmrl_core.modules import TransformersWrapper

    model, tokenizer = hf_model_fp32
    policy = TransformersWrapper(
        model,
        tokenizer=tokenizer,
        input_mode="history",
        generate=True,
        generate_kwargs={"max_new_tokens": 5, "do_sample": False},
    )
    queries = ["What is 2+3?", "Name a colour."]
    by_hand = policy(ChatEnv(batch_size=(2,)).reset(TensorDict({"query": queries}, batch_size=(2,))))
    expected = [h.to_messages()[-1].text for h in by_hand["history", "full"].unbind(0)]
    env = ChatEnv(batch_size=(2,), tokenizer=tokenizer, max_turns=1)
    prompts = [{"query": q} for q in queries]
    batch = next(iter(LLMCollector(env, policy=policy, prompts=prompts, total_trajectories=2)))
    answers = [h.to_messages()[-1] for h in batch["history", "full"].unbind(0)]
    assert [a.role for a in answers] == ["assistant", "assistant"]
    assert [a.text for a in answers] == expected and all(e and "NonTensorData" not in e for e in expected)


@pytest.mark.parametrize("whole_episodes", [True, False])
def test_batches_carry_torchrls_next_entry_and_the_prompt_rows_fields(whole_episodes):
    """TorchRL's collector hands out ``("next", "reward")``, ``("next", "done")``, ``("next", "history").prompt`` (the
    conversation so far) and the prompt row's fields at the root and under "next"; llmrl's batch has them beside its
    own root ``reward``/``done``."""
    env, _ = _scripted_env()
    rows = [{"query": "long", "turns": 2, "answer": "A"}, {"query": "short", "answer": "B"}]
    kwargs = {"total_trajectories": 2} if whole_episodes else {"dialog_turns_per_batch": 2, "total_dialog_turns": 2}
    batch = next(iter(LLMCollector(env, scripted_policy, prompts=rows, **kwargs)))
    assert batch.batch_size == ((2,) if whole_episodes else (2, 1))  # dialog turns: (slots, steps), as TorchRL
    batch = batch.view(-1)
    assert torch.equal(batch["next", "reward"], batch["reward"]) and torch.equal(batch["next", "done"], batch["done"])
    assert batch["next", "truncated"].shape == batch["next", "terminated"].shape == (2, 1)
    assert sorted(batch["answer"]) == sorted(batch["next", "answer"]) == ["A", "B"]
    for i in range(2):
        following = [m.text for m in batch[i]["next", "history"].prompt.to_messages()]
        assert following == [m.text for m in batch[i]["history", "full"].to_messages()]
        assert following[-1] == "ok" and batch[i]["query"] in following


def test_dialog_turn_batch_shapes_match_torchrls_golden(hf_model_fp32):
    """The shapes TorchRL 0.14.1's own collector gives (``api_probes.json`` ``collector_layout``, recorded by
    ``scripts/torchrl_goldens.py`` on the same set-up): ``(slots, steps)`` by default, ``(slots * steps,)`` with
    ``flatten_data=True``, the flags one more dimension."""
    import json
    from pathlib import Path

    from torch.utils.data import DataLoader

    from llmrl_core.modules import TransformersWrapper

    golden = json.loads((Path(__file__).parent / "goldens/torchrl/api_probes.json").read_text())["collector_layout"]
    model, tokenizer = hf_model_fp32
    policy = TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="history", generate=True, generate_kwargs={"max_new_tokens": 4}
    )
    for label, kwargs in (("default", {}), ("flatten_data", {"flatten_data": True})):
        prompts = DataLoader([{"query": f"Say {i}."} for i in range(8)], batch_size=2)
        env = ChatEnv.from_dataloader(prompts, tokenizer=tokenizer, batch_size=(2,))
        collector = LLMCollector(env, policy=policy, dialog_turns_per_batch=4, total_dialog_turns=8, **kwargs)
        batch = next(iter(collector))
        ours = {
            "batch_size": list(batch.batch_size),
            "done": list(batch["done"].shape),
            "next_done": list(batch["next", "done"].shape),
            "flatten_data": collector.flatten_data,
        }
        assert ours == golden[label], label


def test_a_torchrl_style_tool_in_a_tokens_mode_collector_stores_its_output_outside_the_policy_mask(policy):
    """The collector's (and the rollout actors') list calls in tokens mode with a tool written as TorchRL writes one
    (its ``_step`` extends ``("history", "prompt")`` with a ``tool`` message): every two-turn episode's row holds the
    tool's message in its conversation and its ids in the tokens, outside the policy mask, which covers exactly the
    sampled ids of both turns, each with its sampler log-prob."""
    from llmrl_core.data import History
    from llmrl_core.envs.transforms.td_base import Transform as TensorDictTransform

    class Clock(TensorDictTransform):
        def _step(self, tensordict, next_tensordict):
            history = next_tensordict["history"].prompt
            size = history.batch_size[0]
            tool = History(role=[["tool"]] * size, content=[["It is 12:00."]] * size, batch_size=(size, 1))
            history.extend(tool, dim=-1)
            next_tensordict["history"].prompt = history
            return next_tensordict

    env = ChatEnv(tokenizer=policy.tokenizer, input_mode="tokens", max_turns=2, batch_size=2)
    env.append_transform(Clock())
    prompts = [{"query": "What time is it?"}, {"query": "Is it noon?"}]
    rows = episodes(LLMCollector(env, policy, prompts=prompts, total_trajectories=2).collect())
    assert len(rows) == 2
    for row in rows:
        roles = [m["role"] for m in row.episode_messages]
        assert roles == ["assistant", "tool", "assistant"] and row.num_turns == 2  # what followed the prompt
        assert "<|im_start|>tool\nIt is 12:00.<|im_end|>" in policy.tokenizer.decode(row.tokens.tolist())
        tool_ids = policy.tokenizer("It is 12:00.", add_special_tokens=False)["input_ids"]
        ids, mask = row.tokens.tolist(), row.policy_mask.tolist()
        starts = [i for i in range(len(ids)) if ids[i : i + len(tool_ids)] == tool_ids]
        assert len(starts) == 1 and not any(mask[starts[0] : starts[0] + len(tool_ids)])
        assert len(row.sampler_log_probs) == int(row.policy_mask.sum()) == row.num_sampled_tokens
