"""Offline GRPO from stored trajectories: the reward registry by hand, then the flow on the packaged model
(re-scoring changes the rewards, advantages are recomputed, a new run gets checkpoints and lineage)."""

from __future__ import annotations

import sys

import pytest
import torch

from llmrl_core.pipeline.config_io import ConfigError, load_config
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.rescoring import make_rescorer

# GSM8K train rows 0, 1, 2 have gold answers 72, 10 and 5.
RESPONSES = {
    0: [("<think>48/2=24, 48+24=72</think><answer>72</answer>", 0.0), ("<answer>70</answer>", 0.0)],
    1: [("It is 10 dollars.", 0.0), ("<answer>$10.00</answer>", 0.0)],
    2: [("<answer>3</answer>", 0.0), ("<answer>4</answer>", 0.0)],
}
# Expected GSM8K rewards (TorchRL's scheme: 1 correct, 0.1 tagged but wrong, 0 without an answer tag), by hand.
EXPECTED = {("0", 0): 1.0, ("0", 1): 0.1, ("1", 0): 0.0, ("1", 1): 1.0, ("2", 0): 0.1, ("2", 1): 0.1}


def _row(prompt_id, user, assistant, n_tokens=4):
    return {
        "prompt_id": prompt_id,
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
        "response_tokens": list(range(n_tokens)),
        "response_mask": [True] * (n_tokens - 1) + [False],
        "reward": 0.5,
    }


def test_rescorers_by_hand():
    from llmrl_core.builtin_data import load_gsm8k

    question = load_gsm8k("train", limit=1)[0]["question"]
    gsm8k = make_rescorer("gsm8k")
    assert gsm8k(_row("0", f"{question}\n\nThink...", "<answer>72</answer><|im_end|>"))["reward"] == 1.0
    assert gsm8k(_row("0", question, "<answer>71</answer>"))["reward"] == 0.1
    assert make_rescorer("gsm8k_strict")(_row("0", question, "<answer>71</answer>"))["reward"] == 0.0
    assert make_rescorer("stored")(_row("0", question, "x"))["reward"] == 0.5
    brevity = make_rescorer("brevity", max_tokens=10)(_row("0", question, "x", n_tokens=5))
    assert brevity == {"reward": 0.6, "assistant_tokens": 4.0}  # 1 - 4/10: the masked token does not count
    with pytest.raises(ValueError, match="does not contain question 1 of"):
        gsm8k(_row("1", question, "<answer>72</answer>"))
    with pytest.raises(ValueError, match="prompt_id '99999999' is not a row"):
        gsm8k(_row("99999999", question, "<answer>72</answer>"))
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        make_rescorer("nope")
    with pytest.raises(ValueError, match="has no 'assistant' message"):
        gsm8k({**_row("0", question, ""), "messages": [{"role": "user", "content": question}]})


def test_env_reward_functions_rescore_stored_rows(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def echo_len(prompt, completion, row):\n    return len(prompt) + 0.5 * len(completion)\n"
        "def has_id(prompt, completion, row):\n    return float(row.get('prompt_id') == '7')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = [{"function": "my_rewards:echo_len", "weight": 0.1}, {"function": "my_rewards:has_id", "name": "id"}]
    scorer = make_rescorer("env", "", rewards=rewards)
    row = {
        "prompt_id": "7",
        "turn": 0,
        "messages": [
            {"role": "user", "content": "example?"},  # a few-shot example: not the prompt
            {"role": "assistant", "content": "shown"},
            {"role": "user", "content": "real?"},
            {"role": "assistant", "content": "abcd"},
        ],
    }
    out = scorer(row)
    assert out == pytest.approx({"reward": 0.1 * (5 + 2) + 1.0, "echo_len": 0.7, "id": 1.0})
    with pytest.raises(ConfigError, match="rescore.reward 'env' re-scores with env.rewards"):
        load_config(OfflineConfig, None, ["source.run_id=a", "rescore.reward=env"])
    cfg = load_config(
        OfflineConfig, None, ["source.run_id=a", "rescore.reward=env", "env.rewards=[{function: 'my_rewards:has_id'}]"]
    )
    assert cfg.env.rewards[0].function == "my_rewards:has_id"
    with pytest.raises(ConfigError, match="cannot import module 'nowhere'"):
        load_config(OfflineConfig, None, ["source.run_id=a", "env.rewards=[{function: 'nowhere:f'}]"])
    sys.modules.pop("my_rewards", None)


def test_config():
    cfg = load_config(
        OfflineConfig, None, ["source.run_id=a", "source.versions=[0, 2]", "rescore.options={max_tokens: 9}"]
    )
    assert (cfg.source.versions, cfg.rescore.options, cfg.train.clip_epsilon) == ([0, 2], {"max_tokens": 9}, 0.2)
    with pytest.raises(ConfigError, match="must differ from source.run_id"):
        load_config(OfflineConfig, None, ["run_id=a", "source.run_id=a"])


def _store(tmp_path, hf_model_fp32):
    from chat_trajectories import gsm8k_records

    from storage.trajectories import TrajectoryStore

    model, tok = hf_model_fp32
    store = TrajectoryStore(tmp_path / "runs" / "trajectories")
    store.write_shard("src", 0, 0, gsm8k_records(model, tok, "src", 0, {0: RESPONSES[0], 1: RESPONSES[1]}))
    store.write_shard("src", 1, 0, gsm8k_records(model, tok, "src", 1, {2: RESPONSES[2]}))
    return store


def test_stored_rewards_without_signal_is_a_clear_error(tmp_path, hf_model_fp32):
    from storage.layout import RunLayout
    from tasks.offline_stages import rescore

    _store(tmp_path, hf_model_fp32)
    cfg = load_config(OfflineConfig, None, [f"runs_dir={tmp_path / 'runs'}", "source.run_id=src"])
    with pytest.raises(ValueError, match="every advantage is 0, nothing to learn"):
        rescore.fn(cfg, str(tmp_path / "runs" / "trajectories"), RunLayout("offline-demo", tmp_path / "runs"))


@pytest.mark.slow
def test_offline_rescored_training(tmp_path, hf_model_fp32):
    from safetensors.torch import load_file

    from flows.offline import offline
    from llmrl_core.objectives import mc_advantage
    from runtime.train_data import read_samples
    from storage.lineage_query import version_lineage
    from storage.trajectories import TrajectoryStore

    _store(tmp_path, hf_model_fp32)
    summary = offline(
        overrides=[
            "run_id=off1",
            f"runs_dir={tmp_path / 'runs'}",
            "source.run_id=src",
            "rescore.reward=gsm8k",
            "epochs=1",
            "groups_per_step=2",
            "train.lr=1e-5",
        ]
    )
    assert summary["published_version"] == 1 and summary["versions"] == [0, 1]
    rescored = TrajectoryStore(summary["rescored"]).read_records("src")
    assert {(r.group_id, r.sample_index): r.reward for r in rescored} == EXPECTED  # re-scoring changed the rewards
    assert all(r.reward_components["stored_reward"] == 0.0 for r in rescored)
    assert {r.policy_version for r in rescored} == {0, 1}  # provenance kept: still the source's samples
    # advantages recomputed per group: group 2 (0.1, 0.1) has no signal and is left out of training
    expected = mc_advantage([r.reward for r in rescored], [r.group_id for r in rescored]).advantages.tolist()
    assert [r.advantage for r in rescored] == pytest.approx(expected)
    samples, groups = read_samples(summary["samples"])
    assert sorted(set(groups)) == ["0/0", "0/1"] and len(samples) == 4
    assert all(abs(abs(s.advantage) - 0.7071067) < 1e-5 for s in samples)  # +-1/sqrt(2): two unequal rewards
    ckpt = tmp_path / "runs" / "off1" / "checkpoints"
    w0, w1 = load_file(ckpt / "policy_v000000.safetensors"), load_file(ckpt / "policy_v000001.safetensors")
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)
    info = version_lineage("off1", 1, run_dir=tmp_path / "runs" / "off1")
    assert info["pipeline"] == "offline" and info["parent_version"] == 0
    trained_on = {d["source"] for d in info["data"]}
    assert any("off1/rescored" in s and s.endswith("policy_version=1") for s in trained_on)
    sources = {d["source"] for d in info["run_inputs"] if d["context"] == "source"}
    assert any("runs/trajectories/run_id=src/policy_version=0" in s for s in sources)
