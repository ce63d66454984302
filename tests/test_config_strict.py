"""Config input that YAML 1.1 or a loose loader would silently change is refused or kept as written, early
(llmrl_core/pipeline/config_io.py, preflight.py): empty files, duplicate keys, numbers given to text settings,
yes/no words, GRPO settings that would train on nothing; and the chat template fallback is said out loud."""

from __future__ import annotations

import logging

import pytest

from llmrl_core.pipeline.config_io import ConfigError, load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.preflight import PreflightError, check_grpo_training, preflight


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_an_empty_config_file_is_an_error_not_the_defaults(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"{path}: the config file is empty"):
        load_config(GRPOConfig, path)


def test_a_key_given_twice_names_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run_id: a\ntrain:\n  lr: 1e-6\n  lr: 2e-6\n")
    with pytest.raises(ConfigError, match=rf"{path}: line 4: key 'lr' is given twice \(first on line 3\)"):
        load_config(GRPOConfig, path)


def test_text_settings_keep_what_was_written(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run_id: 007\nprogress: no\ntrain:\n  kl_in: reward\n")
    cfg = load_config(GRPOConfig, path)
    assert cfg.run_id == "007" and cfg.progress is False and cfg.train.kl_in == "reward"
    assert load_config(GRPOConfig, None, ["run_id=007"]).run_id == "007"
    assert load_config(GRPOConfig, None, ["run_id=no"]).run_id == "no"  # a word, not False
    assert load_config(GRPOConfig, None, ["progress=off"]).progress is False  # a boolean setting takes the words
    assert load_config(GRPOConfig, None, ["data.group_size=8"]).data.group_size == 8
    assert type(load_config(GRPOConfig, None, ["data.group_size=8"]).data.group_size) is int
    with pytest.raises(ConfigError, match=r"progress: expected bool, got 'maybe'"):
        load_config(GRPOConfig, None, ["progress=maybe"])


def test_grpo_settings_that_would_learn_nothing_are_refused():
    one = load_config(GRPOConfig, None, ["data.group_size=1"])
    with pytest.raises(PreflightError, match=r"data.group_size=1: GRPO compares the answers of a group"):
        check_grpo_training(one)
    preflight(one, training=False)  # sampling once per prompt is fine for a collect
    tight = load_config(GRPOConfig, None, ["train.token_budget=100", "rollout.max_new_tokens=128"])
    with pytest.raises(PreflightError, match=r"train.token_budget=100 cannot hold one sequence"):
        check_grpo_training(tight)


def test_a_tokenizer_without_a_chat_template_is_named_once(caplog):
    from llmrl_core.data.chat_templates import resolve_template

    class Bare:
        name_or_path = "my-bare-model"
        chat_template = None

    with caplog.at_level(logging.WARNING, logger="llmrl.templates"):
        resolved = resolve_template(Bare())
        resolve_template(Bare())
    assert resolved.source.startswith("fallback:")
    warned = [r for r in caplog.records if "my-bare-model has no chat template" in r.getMessage()]
    assert len(warned) == 1


def test_settings_checked_against_the_machine_and_the_model(tmp_path, default_model_path):
    from llmrl_core.pipeline.preflight import check_context_length, check_runs_dir, check_tracking_uri
    from llmrl_core.pipeline.sft_config import SFTConfig

    with pytest.raises(PreflightError, match=r"rollout.max_model_len=100000 exceeds the model's max_position_emb"):
        check_context_length(default_model_path, 100000)
    check_context_length(default_model_path, 8192)
    with pytest.raises(PreflightError, match=r"tracking_uri='foo://bar': MLflow has no tracking store for the sch"):
        check_tracking_uri("foo://bar")
    for fine in (None, "sqlite:////tmp/x.db", "http://127.0.0.1:5000", str(tmp_path / "mlruns")):
        check_tracking_uri(fine)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(PreflightError, match=rf"runs_dir='{blocker}/runs': {blocker} is a file, not a folder"):
        check_runs_dir(str(blocker / "runs"))
    check_runs_dir(str(tmp_path / "new" / "runs"))  # created on first use
    for bad in ("train.lr=nan", "train.lr=-1", "train.max_grad_norm=0"):
        with pytest.raises(ConfigError, match=r"train\.(lr|max_grad_norm) must be (a finite number|> 0), got"):
            load_config(SFTConfig, None, [bad])


def test_settings_go_over_the_file_and_under_the_overrides(tmp_path):
    """A flow's ``settings`` (the run form's nested mapping, or a whole config) layer between file and overrides."""
    path = tmp_path / "c.yaml"
    path.write_text("run_id: from-file\ndata:\n  group_size: 8\n  prompts_per_iteration: 3\ntrain:\n  lr: 1e-6\n")
    cfg = load_config(GRPOConfig, path, ["train.lr=3e-6"], {"data": {"group_size": 2}, "train": {"lr": 2e-6}})
    assert (cfg.run_id, cfg.data.group_size, cfg.data.prompts_per_iteration) == ("from-file", 2, 3)  # merged per key
    assert cfg.train.lr == 3e-6
    whole = load_config(GRPOConfig, None, ["iterations=2"], cfg)  # a config given whole is taken whole
    assert whole.data == cfg.data and whole.run_id == "from-file" and whole.iterations == 2
    with pytest.raises(ConfigError, match=r"unknown config key 'data.groupsize'; valid keys here: \['group_size'"):
        load_config(GRPOConfig, None, [], {"data": {"groupsize": 2}})
    with pytest.raises(ConfigError, match=r"data.group_size: expected int, got 'two'"):
        load_config(GRPOConfig, None, [], {"data": {"group_size": "two"}})
    with pytest.raises(ConfigError, match=r"settings: expected a config or a mapping of settings, got int"):
        load_config(GRPOConfig, None, [], 3)
