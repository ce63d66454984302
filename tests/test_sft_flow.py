"""The SFT flow on the packaged model: from GSM8K chats (the loss on its data falls, checkpoints and lineage are
written, a rerun resumes) and from stored trajectories through TopKRewardSelector."""

from __future__ import annotations

import hashlib

import pytest
import torch
from cli_runs import cli_env

from llmrl_core.pipeline.config_io import ConfigError, load_config
from llmrl_core.pipeline.sft_config import SFTConfig
from runtime.train_data import epoch_batches, read_samples, samples_fingerprint, write_samples
from tasks.sft_stages import gsm8k_chat, tokenize_chat


def test_config_and_errors(tmp_path):
    cfg = load_config(SFTConfig, None, ["train.lr=1e-4", "data.limit=null", "epochs=3"])
    assert (cfg.train.lr, cfg.data.limit, cfg.epochs, cfg.source) == (1e-4, None, 3, "dataset")
    with pytest.raises(ConfigError, match="trajectories.run_id"):
        load_config(SFTConfig, None, ["source=trajectories"])
    with pytest.raises(ConfigError, match="must be one of"):
        load_config(SFTConfig, None, ["data.gsm8k_format=fancy"])


def test_tokenize_chat_trains_on_assistant_tokens_only(hf_model_fp32):
    _, tok = hf_model_fp32
    chat = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "Let me compute."},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": "<answer>5</answer>"},
    ]
    sample, truncated = tokenize_chat(chat, tok, 512, "row 0")
    assert not truncated
    trained = [t for t, m in zip(sample.response_ids, sample.response_mask, strict=True) if m]
    untrained = [t for t, m in zip(sample.response_ids, sample.response_mask, strict=True) if not m]
    text = tok.decode(trained)
    assert "Let me compute." in text and "<answer>5</answer>" in text and "Go on" not in text
    assert "Go on." in tok.decode(untrained)
    assert "What is 2+3?" in tok.decode(sample.prompt_ids) and "Let me" not in tok.decode(sample.prompt_ids)
    short, cut = tokenize_chat(chat, tok, len(sample.prompt_ids) + 3, "row 0")
    assert cut and len(short.prompt_ids) + len(short.response_ids) == len(sample.prompt_ids) + 3
    with pytest.raises(ValueError, match="row 7: the chat has no assistant message"):
        tokenize_chat(chat[:1], tok, 512, "row 7")


def test_gsm8k_chat_tags():
    chat = gsm8k_chat("Q?", "She has 3+2=<<3+2=5>>5 apples.\n#### 5", "tags")
    assert chat[-1]["content"] == "<think>She has 3+2=5 apples.</think>\n<answer>5</answer>"
    assert chat[1]["content"].startswith("Q?")


def test_question_rows_get_the_prompt_of_the_runs_env():
    from llmrl_core.pipeline.config_io import build
    from llmrl_core.pipeline.env_config import build_env
    from llmrl_core.pipeline.sft_config import SFTConfig
    from tasks.sft_stages import row_chat

    row = {"question": "What is 12 * 13?", "answer": "#### 156"}
    default = SFTConfig()
    env = build_env(default.env, default.task, None, input_mode="history")
    assert row_chat(row, default, "r0", env) == gsm8k_chat(row["question"], row["answer"], "tags")  # GRPO defaults
    env.close()
    shot = {
        "question": "What is 2 * 3?",
        "turns": [
            {"role": "assistant", "content": "```python\nprint(2 * 3)\n```"},
            {"role": "tool", "content": "Code block 1 executed successfully:\n6\n"},
            {"role": "assistant", "content": "<answer>6</answer>"},
        ],
    }
    cfg = build(
        SFTConfig,
        {
            "env": {"name": "arithmetic_python"},
            "task": {"system_prompt": "Solve.", "question_template": None, "few_shot": [shot]},
        },
    )
    env = build_env(cfg.env, cfg.task, None, input_mode="history")
    chat = row_chat(row, cfg, "r0", env)
    env.close()
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert "```python" in chat[0]["content"]  # the tool's instructions, as the GRPO env gives them
    assert chat[-2]["content"] == "What is 12 * 13?" and chat[-1]["content"] == "<answer>156</answer>"
    with pytest.raises(ValueError, match="env.name"):
        build(SFTConfig, {"env": {"name": "nope"}})


def test_samples_file_round_trip(tmp_path):
    from llmrl_core.trainer.batch import TrainSample

    samples = [TrainSample([1, 2], [3, 4], [True, False], sampler_logprobs=[-0.5, float("nan")], advantage=1.5)]
    written = write_samples(tmp_path / "s.parquet", samples, ["g"])
    assert written.location == str(tmp_path / "s.parquet")
    assert written.sha256 == hashlib.sha256((tmp_path / "s.parquet").read_bytes()).hexdigest()
    back, groups = read_samples(written.location)
    assert groups == ["g"] and back[0].response_mask == [True, False] and back[0].advantage == 1.5
    assert back[0].sampler_logprobs[0] == -0.5 and back[0].ref_logprobs is None
    remote = write_samples("memory://samples-test/runs/r/s.parquet", samples, ["g"])  # any filesystem URI
    assert remote.location == "memory://samples-test/runs/r/s.parquet" and remote.sha256 == written.sha256
    again, _ = read_samples(remote.location)
    assert again[0].prompt_ids == [1, 2] and samples_fingerprint(remote.location)[2] == len(
        (tmp_path / "s.parquet").read_bytes()
    )
    batches = epoch_batches(["a", "a", "b", "c"], 2, seed=0, epoch=0)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    assert all((0 in b) == (1 in b) for b in batches)  # a group stays in one mini-batch
    assert [len(b) for b in batches] in ([3, 1], [2, 2])


def _tiny(tmp_path, *extra):
    return [
        "run_id=sft1",
        f"runs_dir={tmp_path / 'runs'}",
        "data.limit=4",
        "data.max_length=192",
        "train.batch_size=4",
        "train.lr=5e-5",
        "keep_checkpoints=5",
        *extra,
    ]


@pytest.mark.slow
def test_sft_from_trajectories_keeps_top_k(tmp_path, hf_model_fp32):
    from chat_trajectories import gsm8k_records

    from flows.sft import sft
    from storage.lineage_query import version_lineage
    from storage.trajectories import TrajectoryStore

    model, tok = hf_model_fp32
    store = TrajectoryStore(tmp_path / "runs" / "trajectories")
    responses = {
        0: [("<answer>7</answer>", 0.0), ("<think>48/2=24, 48+24=72</think><answer>72</answer>", 1.0)],
        1: [("<answer>10</answer>", 1.0), ("I do not know.", 0.0)],
        2: [("<answer>1</answer>", 0.1), ("<answer>2</answer>", 0.1)],  # equal rewards: dropped
    }
    store.write_shard("src", 0, 0, gsm8k_records(model, tok, "src", 0, responses))
    summary = sft(
        overrides=[
            "run_id=sft2",
            f"runs_dir={tmp_path / 'runs'}",
            "source=trajectories",
            "trajectories.run_id=src",
            "epochs=1",
            "train.batch_size=2",
        ]
    )
    assert summary["published_version"] == 1
    selected = TrajectoryStore(tmp_path / "runs" / "sft2" / "selected").read_records("src", version=0)
    assert sorted((r.group_id, r.sample_index) for r in selected) == [("0", 1), ("1", 0)]
    samples, _ = read_samples(summary["samples"])
    assert [s.response_ids for s in samples] == [r.response_tokens for r in selected]
    info = version_lineage("sft2", 1, run_dir=tmp_path / "runs" / "sft2")
    trained_on = {d["name"]: d["source"] for d in info["data"]}
    assert "sft2/selected" in trained_on["trajectories/src/policy_version=0"]
    contexts = {(d["source"].split("/runs/")[1], d["context"]) for d in info["run_inputs"]}
    assert ("trajectories/run_id=src/policy_version=0", "source") in contexts


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
def test_the_epoch_trainer_is_built_as_the_grpo_trainer_is(tmp_path, monkeypatch):
    """SFT's resident trainer goes through TrainerWorker.__init__: its train section's LoRA, gradient checkpointing
    and precision apply as they do to GRPO's, with its own objective and reference model."""
    from llmrl_core.objectives import SFTLoss
    from runtime.sft_actor import EpochTrainerWorker
    from storage.layout import RunLayout
    from tasks.sft_stages import trainer_setup

    monkeypatch.setenv("LLMRL_HOME", str(tmp_path))
    cfg = load_config(
        SFTConfig,
        None,
        [
            f"runs_dir={tmp_path / 'runs'}",
            "train.lora.enabled=true",
            "train.lora.target_modules=[q_proj]",
            "train.gradient_checkpointing=true",
            "train.kl_to_ref_coeff=0.1",
            "train.threads=1",
        ],
    )
    worker = EpochTrainerWorker(trainer_setup(cfg), RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir))
    model = worker.trainer.model
    assert isinstance(worker.trainer.objective, SFTLoss) and worker.ref is not None
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert model.is_gradient_checkpointing
    assert worker.describe()["trainer_precision"] in ("bf16", "no")


@pytest.mark.slow
@pytest.mark.xdist_group("dev-shm")  # see tests/conftest.py
def test_sft_heals_resumes_and_lowers_the_loss_with_its_lineage(tmp_path, default_model_path):
    """SFT from GSM8K, end to end.

    1. ``llmrl run sft`` with 2 epochs heals as GRPO does (dask.restarts): the trainer worker is killed (SIGKILL) when
       first asked for epoch 1; the flow names the lost worker in one line, starts a new one, resumes after the
       published version 1 (not retrained: its checkpoint is untouched) and finishes with exit 0 and every version
       committed once.
    2. The same run id with a third epoch continues at epoch 2 (versions 1 and 2 are not retrained); once finished,
       running it again has nothing to do.
    3. SFT lowers the loss on its own data epoch after epoch, and each version's lineage names its data and parent."""
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    from flows.sft import sft
    from llmrl_core.builtin_data import gsm8k_path
    from storage.lineage_query import version_lineage

    preload = str(Path(__file__).parent / "fault_preloads" / "trainer_worker_dies_once_at_epoch_1.py")
    marker = tmp_path / "killed.txt"
    args = [a for o in _tiny(tmp_path, "epochs=2") for a in ("--set", o)]
    env = cli_env(
        DASK_DISTRIBUTED__WORKER__PRELOAD=repr([preload]), LLMRL_TEST_FAULT_MARKER=str(marker), LLMRL_VERBOSE="0"
    )
    done = subprocess.run(
        [sys.executable, "-c", "from llmrl_cli.main import app; app()", "run", "sft", *args],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert marker.exists(), "the fault did not happen"
    restarts = [line for line in text.splitlines() if "Restart 1 of 2 (dask.restarts)" in line]
    assert len(restarts) == 1 and "trainer worker" in restarts[0], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    state = tmp_path / "runs" / "sft1" / "state"
    assert sorted(p.name for p in state.glob("published-v*.json")) == [f"published-v{v}.json" for v in range(3)]
    ckpt = tmp_path / "runs" / "sft1" / "checkpoints"
    assert all((ckpt / f"policy_v{v:06d}.safetensors").is_file() for v in (1, 2))
    killed_at = marker.stat().st_mtime  # version 1 was committed before the kill and not written again after it
    assert (ckpt / "policy_v000001.manifest.json").stat().st_mtime < killed_at
    assert (ckpt / "policy_v000002.manifest.json").stat().st_mtime > killed_at

    # a third epoch on the same run id continues at epoch 2: versions 1 and 2 are not retrained
    v12_bytes = [(ckpt / f"policy_v{v:06d}.safetensors").read_bytes() for v in (1, 2)]
    summary = sft(overrides=_tiny(tmp_path, "epochs=3"))
    assert summary["published_version"] == 3
    assert [(ckpt / f"policy_v{v:06d}.safetensors").read_bytes() for v in (1, 2)] == v12_bytes
    v3_bytes = (ckpt / "policy_v000003.safetensors").read_bytes()
    again = sft(overrides=_tiny(tmp_path, "epochs=3"))  # a finished run: nothing to do
    assert again["published_version"] == 3 and (ckpt / "policy_v000003.safetensors").read_bytes() == v3_bytes
    loss = summary["data_loss"]
    assert loss[3] < loss[2] < loss[1] < loss[0], loss  # SFT lowers the loss on its own data, epoch after epoch
    w0, w3 = load_file(ckpt / "policy_v000000.safetensors"), load_file(ckpt / "policy_v000003.safetensors")
    assert any(not torch.equal(w0[k], w3[k]) for k in w0)
    run_dir = tmp_path / "runs" / "sft1"
    for version in (1, 2, 3):
        info = version_lineage("sft1", version, run_dir=run_dir)
        assert info["pipeline"] == "sft" and info["parent_version"] == version - 1
        sources = {d["source"] for d in info["data"]}
        assert str(gsm8k_path("train")) in sources
        assert any(s.endswith("samples.parquet") for s in sources)
