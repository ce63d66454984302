"""Bad input fails before anything starts: each case asserts the message names the setting / file / row, and that
nothing was written (no run folder, no trajectories, no MLflow store). Cases from the "first hour" review."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmrl_cli.main import app


@pytest.fixture
def cli(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("LLMRL_RUNS_DIR", str(runs))
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, result.output

    invoke.runs = runs  # type: ignore[attr-defined]
    return invoke


def _nothing_written(runs) -> bool:
    return not runs.exists() or not any(runs.rglob("*"))


def _data(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("make_overrides", "message"),
    [
        (lambda d: ["data.source=" + str(d / "missing.jsonl")], "missing.jsonl"),
        (lambda d: ["data.source=" + _data(d, "noq.jsonl", '{"prompt": "x", "answer": "1"}\n')], "no field 'question'"),
        (lambda d: ["data.source=" + _data(d, "empty.jsonl", "")], "has no rows"),
        (
            lambda d: ["data.source=" + _data(d, "bad.jsonl", '{"question": "q", "answer": "1"}\n{oops\n')],
            "bad.jsonl:2",
        ),
        (lambda d: ["data.source=arithmetic:train?ops=^"], "arithmetic ops must be"),
        (lambda d: ["data.source=hf://datasets/openai/gsm8k"], "remote sources are not read here"),
        (lambda d: ["model=/nonexistent/model"], "model: '/nonexistent/model': no such folder"),
        (lambda d: ["model=" + _data(d, "weights.bin", "x")], "is a file; give the model's folder"),
        (lambda d: ["rollout.temperature=-1"], "error: --set rollout.temperature=-1: rollout.temperature must be > 0"),
        (lambda d: ["run_id=a/b"], "run_id: 'a/b' is not a valid run id"),
        (lambda d: ["dask.join_wait_s=-5"], "--set dask.join_wait_s=-5: dask.join_wait_s must be >= 0, got -5"),
        (lambda d: ["dask.restarts=-1"], "dask.restarts must be >= 0, got -1"),
        (lambda d: ["data.source=" + _data(d, "blank.jsonl", '{"question": " ", "answer": "1"}\n')], "1st row) field"),
        # the packaged model's config.json writes 8192.0: vLLM refused it only after the cluster started
        (lambda d: ["rollout.max_model_len=100000"], "rollout.max_model_len=100000 exceeds the model's max_position"),
        # the main job's final evaluation reads task.eval_source after 10 minutes of training: checked up front
        (lambda d: ["task.eval_source=nope:test"], "task.eval_source: source 'nope:test'"),
        (lambda d: ["task.eval_source=" + _data(d, "noanswer.jsonl", '{"question": "1+1"}\n')], "no field 'answer'"),
        # issue 71: each of these started the workers (or Prefect) before it failed
        (lambda d: ["model=" + _model_folder(d, tokenizer=False)], "has no tokenizer (none of tokenizer.json"),
        (lambda d: ["model=" + _model_folder(d, truncate=True)], "the file is truncated or damaged"),
        (lambda d: ["runs_dir=/proc/llmrl-nope"], "runs_dir='/proc/llmrl-nope': its parent /proc cannot hold a new"),
        (lambda d: ["data.source=" + str(d)], "is a folder; give one .jsonl or .parquet file in it"),
        (
            lambda d: ["data.source=" + _data(d, "two.jsonl", '{"question": "q", "answer": "1"}\n' * 2)],
            "data.prompts_per_iteration=8 is more than data.source",
        ),
        (lambda d: ["iterations=0"], "iterations=0: must be >= 1"),
        (
            lambda d: ["env.transforms=[{python_interpreter: {timeout: abc}}]"],
            "env.transforms.python_interpreter.timeout='abc': Input should be a valid number",
        ),
        (lambda d: ["dask.address=tcp://127.0.0.1:1"], "dask.address='tcp://127.0.0.1:1': no Dask scheduler answers"),
    ],
)
def test_grpo_bad_input_fails_before_anything_starts(cli, tmp_path, make_overrides, message, default_model_path):
    # default_model_path: the packaged model prepared, as `llmrl run` prepares it (its config.json is read)
    args = ["run", "grpo"]
    for override in make_overrides(tmp_path):
        args += ["--set", override]
    code, output = cli(*args)
    assert code == 2, output
    assert message in output
    assert "Traceback" not in output and "temporary server" not in output
    assert _nothing_written(cli.runs)


def _model_folder(where: Path, tokenizer: bool = True, truncate: bool = False) -> str:
    """A model folder with a config, a safetensors file and (``tokenizer``) a tokenizer file; ``truncate``: the
    weights file cut short, as an interrupted copy leaves it."""
    import torch
    from safetensors.torch import save_file

    folder = where / f"model-{tokenizer}-{truncate}"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    save_file({"w": torch.zeros(1024)}, str(folder / "model.safetensors"))
    if truncate:
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    return str(folder)


def test_the_eval_source_is_read_only_when_a_final_evaluation_will_read_it(monkeypatch):
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from llmrl_core.pipeline.preflight import PreflightError, preflight

    preflight(load_config(GRPOConfig, None, ["task.eval_source=nope:test"]))  # final_eval.questions=0: never read
    with pytest.raises(PreflightError, match=r"task.eval_source: source 'nope:test'"):
        preflight(load_config(GRPOConfig, None, ["task.eval_source=nope:test", "final_eval.questions=5"]))
    for recipe in ["llmrl_cli/main_job.yaml", *sorted(str(p) for p in Path("recipes").rglob("*.yaml"))]:
        monkeypatch.syspath_prepend(str(Path(recipe).parent))  # a recipe's agent or env module sits beside it
        cfg = load_config(GRPOConfig, Path(recipe))  # every shipped config's own eval source passes
        if "gpu" not in recipe:  # its model is a hub id this machine does not have
            preflight(cfg)


def test_an_mcp_server_that_cannot_start_is_named_before_anything_starts(cli, tmp_path):
    config = tmp_path / "mcp.yaml"
    config.write_text('env:\n  transforms: [{mcp: {servers: {calc: {command: "/nonexistent/bin", args: []}}}}]\n')
    code, output = cli("run", "grpo", "--config", str(config))
    assert code == 2 and "env.transforms.mcp.servers.calc.command: '/nonexistent/bin' is not an executable" in output
    config.write_text("env:\n  transforms: [{mcp: {servers: {calc: {args: []}}}}]\n")
    code, output = cli("run", "grpo", "--config", str(config))
    assert code == 2 and "MCP server 'calc': give exactly one of 'command' (stdio) or 'url' (HTTP)" in output
    assert _nothing_written(cli.runs)


def test_a_bad_row_is_named_from_0_and_as_the_nth_row():
    from llmrl_core.pipeline.preflight import PreflightError, check_rows, ordinal

    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 103, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "103rd", "111th"
    ]  # fmt: skip
    rows = [{"question": "1+1"}] * 21 + [{"question": ""}]
    with pytest.raises(PreflightError, match=r"^f.jsonl: row 21 \(the 22nd row\) field 'question' must be"):
        check_rows(rows, ("question",), "f.jsonl")


def test_a_parquet_whose_question_is_an_int_is_named(cli, tmp_path):
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"question": [1, 2], "answer": ["#### 1", "#### 2"]}), path)
    code, output = cli("run", "grpo", "--set", f"data.source={path}")
    assert code == 2 and "row 0 (the 1st row) field 'question' must be a non-empty string, got int" in output
    assert _nothing_written(cli.runs)


def test_an_uncached_hub_id_offline_is_named(cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, output = cli("run", "grpo", "--set", "model=nobody-llmrl/no-such-model")
    assert code == 2 and "'nobody-llmrl/no-such-model' is neither a local folder nor" in output and "offline" in output
    assert _nothing_written(cli.runs)


def test_sft_and_offline_and_collect_are_checked_too(cli, tmp_path):
    code, output = cli("run", "sft", "--set", "data.source=" + _data(tmp_path, "e.jsonl", ""))
    assert code == 2 and "has no rows" in output
    code, output = cli("run", "offline", "--set", "source.run_id=x/y")
    assert code == 2 and "source.run_id" in output
    code, output = cli("run", "collect", "--set", "data.source=hf://x")
    assert code == 2 and "remote sources" in output
    code, output = cli("run", "collect", "--out-run-id", "../up")
    assert code == 2 and "--out-run-id" in output
    assert _nothing_written(cli.runs)


def test_evaluate_names_a_missing_run_and_bad_versions(cli):
    code, output = cli("run", "evaluate", "NO_SUCH_RUN")
    assert code == 2 and "no run 'NO_SUCH_RUN'" in output
    code, output = cli("run", "evaluate", "NO_SUCH_RUN", "--versions", "1")
    assert code == 2 and "no run 'NO_SUCH_RUN'" in output
    code, output = cli("run", "evaluate", "NO_SUCH_RUN", "--versions", "a,b")
    assert code == 2 and "--versions must be 'all' or a comma list of integers" in output
    code, output = cli("run", "evaluate", "a/b")
    assert code == 2 and "not a valid run id" in output
    assert _nothing_written(cli.runs)


def test_the_evaluate_flow_itself_refuses_a_missing_run(tmp_path):
    from flows.evaluate import evaluate
    from llmrl_core.pipeline.preflight import PreflightError

    with pytest.raises(PreflightError, match="no run 'ghost'"):
        evaluate.fn("ghost", runs_dir=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_models_path_and_lineage_name_bad_references(cli):
    code, output = cli("models", "path", "/nonexistent")
    assert code == 2 and "no such folder" in output
    code, output = cli("lineage", "a/b")
    assert code != 0 and "a/b" in output and "Traceback" not in output


def test_store_refuses_an_empty_shard_and_names_corrupt_ones(tmp_path):
    from storage_records import make_records

    from storage.trajectories import TrajectoryStore, TrajectoryStoreError, TrajectoryValidationError

    store = TrajectoryStore(tmp_path / "store")
    with pytest.raises(TrajectoryValidationError, match="no rows to write"):
        store.write_shard("r", 0, 0, [])
    assert store.versions("r") == []
    store.write_shard("r", 0, 0, make_records("r", 0))
    info = store.write_shard("r", 1, 0, make_records("r", 1))
    data = bytearray(open(info.path, "rb").read())
    middle = len(data) // 2
    data[8:72] = b"\xff" * 64  # a corrupt data page at the start; the footer still parses
    open(info.path, "wb").write(bytes(data))
    with pytest.raises(TrajectoryStoreError, match=r"shard .*policy_version=1/shard-00000.parquet is corrupt"):
        store.read_records("r")
    assert len(store.read_records("r", version=0)) == 8  # the other version stays readable
    open(info.path, "wb").write(bytes(data[: middle // 2]))  # truncated: no footer
    with pytest.raises(TrajectoryStoreError, match="shard-00000.parquet"):
        store.partition_digest("r", 1)
    with pytest.raises(TrajectoryStoreError, match="shard-00000.parquet"):
        store.read_records("r", version=1)
    json.dumps(store.partition_digest("r", 0)[:2])  # the healthy partition still digests


@pytest.mark.parametrize("flow", ["grpo", "sft"])
def test_a_resume_with_other_settings_is_refused_naming_them_before_anything_starts(cli, flow):
    """The run's RUN/config.json holds the settings its versions were made with: a resume that changes one is
    refused at once (exit 2, the setting, the recorded and the new value); a behaviour-only setting may change."""
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from llmrl_core.pipeline.sft_config import SFTConfig
    from tasks.commits import marker_path, save_run_config

    run_dir = cli.runs / "r1"
    run_dir.mkdir(parents=True)
    if flow == "grpo":
        from llmrl_cli.run import MAIN_JOB  # what `llmrl run grpo` runs without --config
        from tasks.grpo_stages import lineage_config

        recorded = lineage_config(load_config(GRPOConfig, MAIN_JOB, ["run_id=r1"]))
    else:
        from tasks.epoch_stages import lineage_config

        recorded = lineage_config(load_config(SFTConfig, None, ["run_id=r1"]))
    save_run_config(run_dir, recorded)
    marker_path(run_dir, 3).parent.mkdir()
    marker_path(run_dir, 3).write_text(json.dumps({"version": 3, "primer_state": None, "metrics": {}}))
    _checkpoint(run_dir, 3)
    before = sorted(cli.runs.rglob("*"))
    code, output = cli("run", flow, "--set", "run_id=r1", "--set", "train.lr=0.5")
    assert code == 2, output
    assert "run 'r1' exists with other settings (train.lr: " in output and "-> 0.5)" in output, output
    assert "a changed config needs a new run id" in output
    assert sorted(cli.runs.rglob("*")) == before  # nothing else written
    from llmrl_cli.run import MAIN_JOB
    from llmrl_cli.run_more import check_resume_config

    config_cls, path = (GRPOConfig, MAIN_JOB) if flow == "grpo" else (SFTConfig, None)
    same = ["run_id=r1", "dask.restarts=0", "dask.join_wait_s=5", "dask.local_directory=/s"]
    same += ["progress=false", "rollout.max_failed_fraction=0.9"] if flow == "grpo" else []
    check_resume_config(load_config(config_cls, path, same))  # behaviour- and where-only settings: no refusal
    # a config.json written before the where-only settings left the lineage (it holds them): still the same run
    old_style = lineage_config(load_config(config_cls, path, ["run_id=r1"]), keep_where=True)
    assert "runs_dir" in old_style
    save_run_config(run_dir, old_style)
    check_resume_config(load_config(config_cls, path, same))


def _checkpoint(run_dir: Path, version: int) -> Path:
    """A small checkpoint of ``version`` in the run's checkpoint store; the weights file's path."""
    import torch

    from storage.checkpoints import CheckpointStore

    store = CheckpointStore(run_dir / "checkpoints")
    store.save({"w": torch.arange(4096, dtype=torch.float32)}, version)
    return Path(store.weights_path(version))


def test_a_resume_whose_checkpoint_is_damaged_is_refused_before_anything_starts(cli):
    """The checkpoint a resume loads is checked (manifest, size, sha256) by the CLI: a truncated or altered file is
    one line naming it, exit 2, before the Prefect API or any worker starts (it was found after ~60 s of loading)."""
    from llmrl_cli.run import MAIN_JOB
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from tasks.commits import marker_path, save_run_config
    from tasks.grpo_stages import lineage_config

    run_dir = cli.runs / "r1"
    save_run_config(run_dir, lineage_config(load_config(GRPOConfig, MAIN_JOB, ["run_id=r1"])))
    marker_path(run_dir, 1).parent.mkdir()
    marker_path(run_dir, 1).write_text(json.dumps({"version": 1, "primer_state": None, "metrics": {}}))
    weights = _checkpoint(run_dir, 1)
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    code, output = cli("run", "grpo", "--set", "run_id=r1")
    assert code == 2 and "Traceback" not in output, output
    assert f"error: resuming run 'r1' at version 1: {weights}: " in output and "(truncated or damaged" in output
    assert "temporary server" not in output
    weights.write_bytes(data[:-4] + b"\x00\x00\x80\x7f")  # same size, one value changed
    code, output = cli("run", "grpo", "--set", "run_id=r1")
    assert code == 2 and "does not match the manifest's" in output and "(corrupt checkpoint)" in output, output
    (run_dir / "checkpoints" / "policy_v000001.manifest.json").unlink()
    code, output = cli("run", "grpo", "--set", "run_id=r1")
    assert code == 2 and "no checkpoint for policy version 1" in output, output


def test_a_busy_run_id_is_refused_before_prefect_starts(cli):
    """A second flow on a run whose lock another process holds: one line naming the holder, exit 2, before the
    Prefect API starts (no FAILED flow run left behind); the lock file is not created by the check."""
    import subprocess
    import sys

    from storage.run_lock import check_not_busy

    run_dir = cli.runs / "busy"
    check_not_busy(run_dir, "busy")  # no lock file: free, and nothing created
    assert not run_dir.exists()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from storage.run_lock import RunLock\n"
         f"with RunLock({str(run_dir)!r}, 'busy'):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        code, output = cli("run", "grpo", "--set", "run_id=busy")
        assert code == 2 and "Traceback" not in output, output
        assert f"error: run 'busy' is already running (pid {holder.pid} on " in output
        assert "temporary server" not in output and "Flow run" not in output
    finally:
        holder.kill()
        holder.wait()
    check_not_busy(run_dir, "busy")  # the holder gone: free again


def test_a_config_section_written_as_a_list_is_named_with_its_file(cli, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("data:\n  - source: gsm8k:train\n")
    for extra in ([], ["--set", "data.source=gsm8k:train"]):
        code, output = cli("run", "grpo", "--config", str(config), *extra)
        assert code == 2 and "Traceback" not in output, output
        assert f"error: {config}: data: expected a mapping of settings, got [{{'source': 'gsm8k:train'}}]" in output


def test_a_run_that_trained_nothing_yet_says_how_to_start_it_over(tmp_path):
    """Settings recorded by an attempt that published nothing do not bind a new attempt; after only version 0 (the
    starting model) the refusal says that nothing was trained and how to start over."""
    from llmrl_cli.run_more import check_resume_config
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.sft_config import SFTConfig
    from tasks.commits import marker_path, save_run_config
    from tasks.epoch_stages import lineage_config

    base = ["run_id=r1", f"runs_dir={tmp_path}"]
    run_dir = tmp_path / "r1"
    save_run_config(run_dir, lineage_config(load_config(SFTConfig, None, base)))
    changed = load_config(SFTConfig, None, [*base, "train.lr=0.5"])
    check_resume_config(changed)  # no version published: the new settings are taken
    marker_path(run_dir, 0).parent.mkdir()
    marker_path(run_dir, 0).write_text(json.dumps({"version": 0, "primer_state": None, "metrics": {}}))
    with pytest.raises(ValueError, match=f"no version of it was trained yet: remove {run_dir} to start it over"):
        check_resume_config(changed)
