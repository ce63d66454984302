"""One GPU for the engine and the trainer: vLLM's sleep mode (``rollout.sleep_level``).

vLLM's sleep mode runs on CUDA only, so these tests drive the engine worker's sleep/wake protocol with a stand-in
``LLM`` that records the calls vLLM would get (``sleep(level)``, ``wake_up()``, ``reset_prefix_cache()``), and check
the settings' refusals; the memory plan's arithmetic with a sleeping engine is in tests/test_memory_plan.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from llmrl_core.modules.backends.types import EngineConfig
from llmrl_core.modules.backends.vllm import worker as vllm_worker
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig


class RecordingLLM:
    """Records what a ``vllm.LLM`` with sleep mode would be asked."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[tuple] = []

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tags))
        return True

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts: Any, params: Any, use_tqdm: bool = False) -> list:
        self.calls.append(("generate", len(prompts)))
        return []


class RecordingUpdater:
    def __init__(self, llm: RecordingLLM) -> None:
        self.llm = llm
        self.engines = [llm]

    def push_weights(self, state: dict) -> None:
        self.llm.calls.append(("load", sorted(state)))


def worker_with(monkeypatch: pytest.MonkeyPatch, sleep_level: int) -> tuple[vllm_worker.vLLMWorker, RecordingLLM]:
    llm = RecordingLLM()
    monkeypatch.setattr(vllm_worker, "make_llm", lambda config: llm)
    worker = vllm_worker.vLLMWorker(EngineConfig(device="cuda", sleep_level=sleep_level))
    worker._updater = RecordingUpdater(llm)
    return worker, llm


def test_level_1_sleeps_after_a_rollout_and_wakes_for_the_next_use(monkeypatch):
    worker, llm = worker_with(monkeypatch, 1)
    assert worker.sleep() >= 0 and worker.asleep
    assert worker.sleep() == 0.0  # already asleep: nothing more asked of vLLM
    worker.generate([[1, 2, 3]])
    assert llm.calls == [("sleep", 1), ("wake_up", None), ("reset_prefix_cache",), ("generate", 1)]
    assert not worker.asleep
    worker.sleep()
    worker.load_weights({"w": torch.zeros(2)}, 3)  # the next version's load wakes it first
    assert llm.calls[-3:] == [("wake_up", None), ("reset_prefix_cache",), ("load", ["w"])]
    assert worker.policy_version == 3 and not worker.asleep


def test_level_2_drops_the_weights_so_only_a_load_may_wake_it(monkeypatch):
    worker, llm = worker_with(monkeypatch, 2)
    worker.sleep()
    with pytest.raises(RuntimeError, match=r"slept at sleep_level=2, which drops its weights: load a version"):
        worker.generate([[1]])
    with pytest.raises(RuntimeError, match="sleep_level=2"):
        worker.score([[1]], [[2]])
    assert llm.calls == [("sleep", 2)]  # refused before vLLM was asked anything
    worker.load_weights({"w": torch.zeros(1)}, 1)
    worker.generate([[1]])  # the loaded version samples
    assert [c[0] for c in llm.calls] == ["sleep", "wake_up", "reset_prefix_cache", "load", "generate"]


def test_without_sleep_mode_sleep_is_a_no_op(monkeypatch):
    worker, llm = worker_with(monkeypatch, 0)
    assert worker.sleep() == 0.0 and not worker.asleep
    worker.generate([[1]])
    assert llm.calls == [("generate", 1)]


def test_the_engine_starts_in_sleep_mode_on_cuda_only(monkeypatch):
    import vllm

    from llmrl_core.modules.backends.vllm import engine as vllm_engine

    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CACHE_ROOT", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.setenv(key, "0" if key == "VLLM_ENABLE_V1_MULTIPROCESSING" else "1")
    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    assert vllm_engine.make_llm(EngineConfig(device="cuda", sleep_level=1)).kwargs["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in vllm_engine.make_llm(EngineConfig(device="cuda")).kwargs
    with pytest.raises(ValueError, match=r"sleep_level=1 needs a CUDA engine .* set rollout.sleep_level=0 on CPU"):
        vllm_engine.make_llm(EngineConfig(device="cpu", sleep_level=1))  # before vLLM starts
    with pytest.raises(ValueError, match="needs the vllm backend"):
        EngineConfig(backend="transformers", sleep_level=1)
    with pytest.raises(ValueError, match=r"sleep_level must be one of \(0, 1, 2\)"):
        EngineConfig(sleep_level=3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.sleep_level=3"], ": must be one of \\[0, 1, 2\\], got 3"),
        (["rollout.sleep_level=1", "rollout.max_staleness=1"], " needs a synchronous run"),
        (["rollout.sleep_level=1", "rollout.backend=transformers"], " needs rollout.backend=vllm"),
    ],
)
def test_the_setting_is_refused_where_it_cannot_work(overrides, message):
    with pytest.raises(ValueError, match=rf"rollout.sleep_level{message}"):
        load_config(GRPOConfig, None, overrides)


def test_the_setting_leaves_the_config_hash_alone():
    from storage.hashing import config_hash
    from tasks.grpo_stages import lineage_config

    base = config_hash(lineage_config(load_config(GRPOConfig)))
    assert config_hash(lineage_config(load_config(GRPOConfig, None, ["rollout.sleep_level=2"]))) == base


def test_the_rollout_worker_sleeps_after_every_rollout_even_a_failed_one():
    from runtime.rollout_actor import RolloutWorker

    engine = SimpleNamespace(policy_version=4, last_wake_s=0.25, slept=0)

    def sleep() -> float:
        engine.slept += 1
        return 0.5

    engine.sleep = sleep
    actor = RolloutWorker.__new__(RolloutWorker)  # no engine start: the rollout itself is stood in for below
    actor.cfg, actor.worker, actor._stopped = load_config(GRPOConfig, None, ["rollout.sleep_level=1"]), engine, False
    actor.busy_until = time.perf_counter()
    actor._rollout = lambda *args: {"rows": 8, "seconds": 1.0}
    out = actor.rollout([], 4, "unused", 0)
    assert engine.slept == 1 and out["engine_sleep_s"] == 0.5 and out["engine_wake_s"] == 0.25

    def fails(*args: Any) -> dict:
        raise RuntimeError("the env broke")

    actor._rollout = fails
    with pytest.raises(RuntimeError, match="the env broke"):
        actor.rollout([], 4, "unused", 0)
    assert engine.slept == 2  # the trainer trains next either way (or the run stops)
    actor.cfg = load_config(GRPOConfig)  # sleep mode off: never asked
    actor._rollout = lambda *args: {"rows": 8, "seconds": 1.0}
    assert "engine_sleep_s" not in actor.rollout([], 4, "unused", 0) and engine.slept == 2


def test_the_local_cluster_refuses_sleep_without_a_gpu_and_notes_it_on_a_shared_one():
    from runtime.placement_plan import gpu_assignment

    asleep = load_config(GRPOConfig, None, ["rollout.sleep_level=1", "rollout.gpu_memory_utilization=0.3"])
    with pytest.raises(ValueError, match=r"rollout.sleep_level=1 .* this host has no GPU .* set rollout.sleep_level=0"):
        gpu_assignment(asleep, 0)  # before any worker starts
    (note,) = gpu_assignment(asleep, 1).notes  # one GPU: the engine beside the trainer
    assert "GPU 0 is shared by rollout-0, trainer" in note and "the engines sleep while the trainer trains" in note
    (note,) = gpu_assignment(asleep, 2).notes  # a GPU each: sleeping frees nothing the trainer could use
    assert "no engine shares a GPU with the trainer" in note and "set rollout.sleep_level=0" in note
