"""The verifiers route end to end (issue 29's acceptance): the GRPO flow trains a ``vf.SingleTurnEnv`` written with
verifiers' own public API (tests/verifiers_envs/vf_tiny_echo.py) for 2 iterations through the rollout engine's
OpenAI endpoint. The stored rows' rewards are the rubric's scores, their sampled ids decode to the replies the
environment saw, and trainer/sampler agreement is at the level of the built-in envs. Skipped only where the
optional 'verifiers' extra is not installed (scripts/install.sh installs it)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ENVS = Path(__file__).parent / "verifiers_envs"


@pytest.fixture
def vf_envs(monkeypatch):
    pytest.importorskip("verifiers", reason="the optional 'verifiers' extra is not installed (llmrl[verifiers])")
    monkeypatch.syspath_prepend(str(ENVS))
    yield
    sys.modules.pop("vf_tiny_echo", None)


@pytest.mark.slow
@pytest.mark.isolated
def test_grpo_trains_a_verifiers_env_for_two_iterations(tmp_path, vf_envs):
    import vf_tiny_echo
    from transformers import AutoTokenizer

    from flows.grpo import grpo
    from llmrl_core.model_store import ensure_default_model
    from storage.trajectories import TrajectoryStore

    runs = tmp_path / "runs"
    grpo(
        overrides=[
            "run_id=vf",
            f"runs_dir={runs}",
            "progress=false",
            "iterations=2",
            "env.verifiers.id=vf-tiny-echo",
            "env.verifiers.args.n_train=4",
            "data.prompts_per_iteration=2",
            "data.group_size=2",
            "rollout.agent_concurrency=4",
            "rollout.agent_timeout_s=90",
            "rollout.max_new_tokens=16",
            "rollout.dtype=float32",
            "rollout.temperature=1.0",
            "train.mixed_precision=no",  # fp32 on both sides, as the built-in envs' agreement test
            "train.lr=1e-5",
        ]
    )
    store = TrajectoryStore(runs / "trajectories")
    assert store.versions("vf") == [0, 1]
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    answers = {q: a for q, a in vf_tiny_echo.QUESTIONS}
    for version in (0, 1):
        records = store.read_records("vf", version=version)
        assert len(records) == 4
        for r in records:
            assert [m["role"] for m in r.messages] == ["system", "user", "assistant"] and r.turn == 0
            reply = r.messages[-1]["content"]
            completion = [{"role": "assistant", "content": reply}]
            says = vf_tiny_echo.says_answer(completion, answers[r.messages[1]["content"]])
            brevity = vf_tiny_echo.brevity(completion)
            assert r.reward == pytest.approx(says + 0.5 * brevity)  # the environment's rubric, weights and all
            assert r.reward_components["says_answer"] == says
            assert r.reward_components["brevity"] == pytest.approx(brevity)
            sampled = [t for t, m in zip(r.response_tokens, r.response_mask, strict=True) if m]
            assert tokenizer.decode(sampled, skip_special_tokens=True) == reply  # the engine's ids, not re-tokenized
            for m, lp in zip(r.response_mask, r.sampler_logprobs, strict=True):
                assert m == math.isfinite(lp)
        metrics = json.loads((runs / "vf" / "state" / f"published-v{version + 1}.json").read_text())["metrics"]
        assert metrics["agent_episodes"] == 4 and metrics["agent_failures"] == 0
        assert metrics["agreement_abs_diff_mean"] < 1e-3, metrics  # as the built-in envs (test_grpo_flow)
