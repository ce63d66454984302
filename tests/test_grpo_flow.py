"""The GRPO flow end to end on the packaged model: a killed run resumes exactly and forks; worker faults heal or
are named; stops and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runs import cli_env, kill_when_committed

from llmrl_core.pipeline.config_io import ConfigError, load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig


def test_config_loads_yaml_and_overrides(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("run_id: exp1\ntrain:\n  lr: 1.0e-5\ndata:\n  group_size: 8\n")
    cfg = load_config(GRPOConfig, path, ["train.lr=1e-6", "rollout.workers=2", "dask.address=null"])
    assert (cfg.run_id, cfg.train.lr, cfg.data.group_size, cfg.rollout.workers) == ("exp1", 1e-6, 8, 2)
    with pytest.raises(ConfigError, match=r"unknown config key 'train.lrr'"):
        load_config(GRPOConfig, path, ["train.lrr=1"])
    path.write_text("data:\n  group_size: many\n")
    with pytest.raises(ConfigError, match=r"grpo.yaml: data.group_size: expected int"):
        load_config(GRPOConfig, path)
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_config(GRPOConfig, None, ["train.lr"])


def _tiny(tmp_path, *extra):
    return [
        "run_id=t1",
        f"runs_dir={tmp_path / 'runs'}",
        "iterations=2",
        "data.prompts_per_iteration=2",
        "data.group_size=2",
        "rollout.max_new_tokens=24",
        "rollout.dtype=float32",
        "train.mixed_precision=no",  # fp32 on both sides: the agreement checks are exact
        "rollout.temperature=1.0",
        "train.entropy_coeff=0.01",
        "train.lr=1e-5",
        "keep_checkpoints=5",
        *extra,
    ]


def _start_cli_run(args: list[str], log=None, own_prefect_api: bool = False, **env: str):
    """``llmrl run grpo ARGS`` in a process group of its own (as a terminal's foreground job; a signal to the group
    reaches its Dask workers too), output to ``log`` (an open file) or discarded; recording into this process's
    Prefect API unless ``own_prefect_api`` (then it starts its own, as ``llmrl run`` alone does)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.Popen(
        [sys.executable, "-c", "from llmrl_cli.main import app; app()", "run", "grpo", *args],
        cwd=Path(__file__).resolve().parents[1],
        env={**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, **env}
        if own_prefect_api
        else cli_env(**env),
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
        start_new_session=True,
    )


def _flow_run_states(run_id: str) -> list:
    """The states of run ``run_id``'s Prefect training flow runs (not its evaluations), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"run:{run_id}"])),
            sort=FlowRunSort.START_TIME_ASC,
        )
    return [run.state for run in runs if "evaluation" not in run.tags]


@pytest.mark.slow
@pytest.mark.xdist_group("dev-shm")  # see tests/conftest.py
def test_a_killed_run_resumes_exactly_and_forks(tmp_path, default_model_path):
    """A real kill (SIGKILL to the flow process and its Dask workers) as soon as version 1 is committed, i.e. beside
    iteration 1's rollouts (version 2 is far from committed), then a resume: iteration 1 runs once, version 0's
    partition is untouched, and (N8) the killed-and-resumed run equals the same run uninterrupted, row for row and in
    its final weights' fingerprint. Then what the resumed run recorded (checkpoints, the engine's log-probs against
    them, lineage, both UIs, MLflow traces) and a fork of its version 1 (N7)."""

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from flows.grpo import grpo
    from runtime.records import record_to_sample
    from storage.handoff import sweep_orphans
    from storage.lineage_query import version_lineage
    from storage.trajectories import TrajectoryStore

    overrides = _tiny(tmp_path, "progress=false")
    runs = tmp_path / "runs"
    state = runs / "t1" / "state"
    staged = runs / "t1" / "staging" / "run_id=t1" / "policy_version=1"
    args = ["--config", "recipes/gsm8k-demo.yaml", *(a for o in overrides for a in ("--set", o))]  # as grpo()
    proc = _start_cli_run(args)  # its own process group: the kill reaches the Dask workers too
    kill_when_committed(proc, state, 1)
    assert sorted(p.name for p in state.glob("published-v*.json")) == ["published-v0.json", "published-v1.json"]
    store = TrajectoryStore(runs / "trajectories")
    # version 1's partition may be in the store already (written after the commit, before the kill lands);
    # no version trained on it is committed, and the resume replaces it
    assert store.versions("t1") in ([0], [0, 1])
    v0_bytes = {s.name: Path(s.path).read_bytes() for s in store.shards("t1", version=0)}

    # resume with the same run id: only the unpublished iteration runs again
    summary = grpo(overrides=overrides)
    assert summary["published_version"] == 2
    # the killed flow run could not report its end: the resumed run's start found its process gone and marked it
    # Crashed, naming the pid (issue 71: it stayed Running for good)
    states = _flow_run_states("t1")
    assert [s.type.value for s in states] == ["CRASHED", "COMPLETED"], states
    assert "ended without reporting (killed)" in states[0].message and f"pid {proc.pid}" in states[0].message
    # the run's trainer handed its weights to the engine through /dev/shm; the flow removed them on its way out (and
    # the killed trainer's were swept by the resumed one)
    assert sweep_orphans() == []
    assert store.versions("t1") == [0, 1]
    assert {s.name: Path(s.path).read_bytes() for s in store.shards("t1", version=0)} == v0_bytes  # nothing repeated
    for version in (0, 1):
        records = store.read_records("t1", version=version)
        assert len(records) == 4  # 2 prompts x 2 samples, not duplicated by the retry
        assert len({(r.group_id, r.sample_index) for r in records}) == 4
        assert all(r.advantage is not None and r.policy_version == version for r in records)
        assert len({r.group_id for r in records}) == 2
    assert not any(staged.glob("*.parquet"))  # the staging partition was published and cleared

    # N8, exactly once: the same run uninterrupted gives the same rows, row for row (prompts, tokens, log-probs,
    # rewards, advantages, versions, the weights that sampled them), and the same final weights (fp32 on CPU)
    grpo(overrides=_tiny(tmp_path, "progress=false", "run_id=ref"))
    same = ("prompt_id", "prompt_tokens", "response_tokens", "response_mask", "sampler_logprobs", "reward")
    same += ("reward_components", "advantage", "finish_reason", "weights_fingerprint", "messages")
    for version in (0, 1):
        killed, whole = (
            {(r.group_id, r.sample_index): r for r in store.read_records(run, version=version)} for run in ("t1", "ref")
        )
        assert killed.keys() == whole.keys() and len(killed) == 4
        for key, row in killed.items():
            assert {f: getattr(row, f) for f in same} == {f: getattr(whole[key], f) for f in same}, (version, key)
    final = [version_lineage(run, 2, run_dir=runs / run)["weights_fingerprints"] for run in ("t1", "ref")]
    assert final[0] == final[1] and final[0]["float32"]

    # the two iterations drew different prompts (the data cursor moved on and was restored on resume)
    prompts = [{r.prompt_id for r in store.read_records("t1", version=v)} for v in (0, 1)]
    assert not prompts[0] & prompts[1]
    assert json.loads((state / "published-v2.json").read_text())["version"] == 2
    # optimizer states older than the previous version are pruned (each is 2x the model)
    assert sorted(p.name for p in state.glob("trainer-v*.pt")) == ["trainer-v1.pt", "trainer-v2.pt"]

    # checkpoints: version 1 differs from version 0
    ckpt = runs / "t1" / "checkpoints"
    w0, w1 = load_file(ckpt / "policy_v000000.safetensors"), load_file(ckpt / "policy_v000001.safetensors")
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)

    # the engine held exactly checkpoint 1 when it sampled version 1's rollouts:
    # its sampler log-probs (fp32 engine) equal checkpoint 1's teacher-forced log-probs
    model = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    model.load_state_dict(w1, strict=False)
    model.tie_weights()
    for record in store.read_records("t1", version=1):
        sample = record_to_sample(record)
        ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(sample.prompt_ids) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.response_ids)[:, None]).squeeze(-1)
        assert (expected - torch.tensor(record.sampler_logprobs)).abs().max().item() < 1e-3

    # MLflow lineage for every published version, with its data and parent
    for version in (1, 2):
        info = version_lineage("t1", version, run_dir=runs / "t1")
        assert info["policy_version"] == version and info["parent_version"] == version - 1
        assert any(d["policy_version"] == version - 1 for d in info["data"])
        # the lineage names the version's checkpoint file, and that file is the one the manifest hashed
        import hashlib
        from urllib.parse import urlparse

        path = Path(urlparse(info["checkpoint_uri"]).path)
        assert info["checkpoint_uri"].startswith("file://") and path.name == f"policy_v{version:06d}.safetensors"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == info["checkpoint"]["sha256"]
        # the weights' fingerprint (N6): the checkpoint file's, computed here, is what the lineage records, and
        # every row the version sampled carries it (the engine's own fingerprint of what it loaded)
        from llmrl_core.weight_sync.fingerprint import weights_fingerprint

        fingerprint = weights_fingerprint(load_file(path), "float32", tied=True)
        assert info["weights_fingerprints"] == {"float32": fingerprint}
        if version < 2:
            assert {r.weights_fingerprint for r in store.read_records("t1", version=version)} == {fingerprint}

    # one run, one identity in both UIs: each flow run is named after the run and the versions it makes, tagged
    # with it; the MLflow run carries the (latest) Prefect flow run's id and address; a link artifact points back
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as prefect:
        flow_runs = prefect.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=["run:t1"])))
        links = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["mlflow-t1"])))
    print("flow runs tagged run:t1:", sorted((r.name, r.state_name) for r in flow_runs))
    assert sorted(r.name for r in flow_runs) == ["t1 v0-2", "t1 v1-2"] and all("llmrl" in r.tags for r in flow_runs)
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("grpo").experiment_id
    (run,) = [r for r in client.search_runs([experiment]) if r.data.tags.get("llmrl_run_id") == "t1"]
    resumed = next(r for r in flow_runs if r.name == "t1 v1-2")
    assert run.data.tags["prefect.flow_run_id"] == str(resumed.id)
    assert run.data.tags["prefect.flow_run_url"].endswith(f"/runs/flow-run/{resumed.id}")
    assert {a.flow_run_id for a in links} == {r.id for r in flow_runs}
    assert all(f"/runs/{run.info.run_id})" in a.data for a in links)  # a markdown link: [text](url)

    # what the model wrote, in MLflow: each trained-on batch's first group and its best and worst response, as
    # traces of the run, with the stored reward and advantage as assessments (version 1's: the resumed run published
    # version 2; version 0's went with the killed process's background reports)
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)
    by_version = {v: [t for t in traces if t.info.tags.get("llmrl.policy_version") == str(v)] for v in (1,)}
    for version, found in by_version.items():
        stored = {(r.group_id, r.sample_index): r for r in store.read_records("t1", version=version)}
        assert 2 <= len(found) <= 4 and "group" in {t.info.tags["llmrl.sample"] for t in found}
        for t in found:
            record = stored[(t.data.spans[0].attributes["group_id"], int(t.data.spans[0].attributes["sample_index"]))]
            feedback = {a.name: a.value for a in t.info.assessments}
            assert feedback["reward"] == pytest.approx(record.reward)
            assert feedback["advantage"] == pytest.approx(record.advantage)

    # N7: fork version 1 into a new run (weights, optimizer state and data cursor): its version 0 holds exactly
    # t1's version 1, its first batch draws the prompts t1's version 1 drew, its MLflow run is t1's child
    fork = grpo(overrides=_tiny(tmp_path, "run_id=t1-fork", "iterations=1", "init.from=t1@1", "init.data_cursor=true"))
    assert fork["published_version"] == 1
    fork_v0 = version_lineage("t1-fork", 0, run_dir=runs / "t1-fork")
    assert fork_v0["forked_from"] == {"run_id": "t1", "policy_version": 1}
    assert fork_v0["weights_fingerprints"] == version_lineage("t1", 1, run_dir=runs / "t1")["weights_fingerprints"]
    first = {r.prompt_id for r in store.read_records("t1-fork", version=0)}
    assert first == {r.prompt_id for r in store.read_records("t1", version=1)}
    (child,) = [r for r in client.search_runs([run.info.experiment_id]) if r.data.tags.get("llmrl_run_id") == "t1-fork"]
    assert child.data.tags["mlflow.parentRunId"] == run.info.run_id
    assert child.data.tags["llmrl.forked_from"] == "t1@1"
    from typer.testing import CliRunner

    from llmrl_cli.main import app

    shown = CliRunner().invoke(app, ["lineage", "t1", "--tree", "--runs-dir", str(runs)])
    assert shown.exit_code == 0 and shown.output.splitlines() == ["t1", "└── t1-fork  (from t1@1)"]


@pytest.mark.slow
def test_an_engine_that_misses_a_version_stops_the_run_before_training_on_its_rows(tmp_path):
    """The bug class of a weight update that never reaches the engine (a LoRA adapter not applied, a failed
    reload): a Dask worker preload makes every engine skip loading version 1 while it reports version 1. The
    engines' fingerprints then differ from the trainer's and the run stops while they sample with it, before their
    rows are published or trained on: version 1 is not committed, and the stored rows carry version 0's
    fingerprint."""
    import dask

    from flows.grpo import grpo
    from llmrl_core.weight_sync.fingerprint import WeightsMismatchError
    from storage.lineage_query import version_lineage
    from storage.trajectories import TrajectoryStore

    preload = str(Path(__file__).parent / "fault_preloads" / "engines_miss_version_1.py")
    with dask.config.set({"distributed.worker.preload": [preload]}), pytest.raises(WeightsMismatchError) as caught:
        grpo(overrides=_tiny(tmp_path, "run_id=t6"))
    message = str(caught.value)
    assert message.startswith("version 1: the trainer published weights ") and "but engine 0 holds" in message
    runs = tmp_path / "runs"
    assert sorted(p.name for p in (runs / "t6" / "state").glob("published-v*.json")) == ["published-v0.json"]
    held_v0 = version_lineage("t6", 0, run_dir=runs / "t6")["weights_fingerprints"]["float32"]
    store = TrajectoryStore(runs / "trajectories")
    assert {r.weights_fingerprint for r in store.read_records("t6", version=0)} == {held_v0}
    assert store.versions("t6") == [0]  # the batch the stale engines were sampling never reached the store
    assert f"engine 0 holds {held_v0} (float32)" in message
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    (failed,) = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    assert failed.info.status == "FAILED"  # a run that fails after it started is marked so in MLflow


@pytest.mark.slow
def test_a_killed_rollout_worker_heals_and_a_hung_one_is_named_within_a_minute(tmp_path, default_model_path):
    """Two faults of the rollout worker in one run, with one restart allowed (``dask.restarts=1``).

    1. It is killed (SIGKILL, as the OOM killer or a lost node would) when first asked for version 1's rollouts. The
       flow names the lost worker in one line (the libraries' tracebacks stay in the run's log files), starts new
       workers, resumes from the last committed version and goes on; version 1's rows are written exactly once.
    2. The new worker's process stops (SIGSTOP, as a frozen node would) when asked for version 2's rollouts. The flow
       notices its silence within a minute (its actor call alone would wait until Dask's worker TTL, ~8 min) and,
       its restart spent, ends with one line naming the worker, the stage and the version, exit 1; versions 0-2 stay
       committed (version 2 was committed while the worker was asked for its rollouts), nothing version 2 sampled is
       stored, and no process of the run is left behind (the stopped worker included)."""
    import signal
    import time

    import psutil

    from runtime.actor_calls import SILENT_LIMIT_S
    from storage.trajectories import TrajectoryStore

    preloads = [
        str(Path(__file__).parent / "fault_preloads" / name)
        for name in ("rollout_worker_dies_once.py", "rollout_worker_hangs.py")
    ]
    marker = tmp_path / "killed.txt"
    overrides = _tiny(
        tmp_path, "progress=false", "run_id=heal", "iterations=3", "final_eval.questions=0", "dask.restarts=1"
    )
    log = tmp_path / "flow.log"
    start = time.monotonic()
    with log.open("w") as out:
        proc = _start_cli_run(
            [a for o in overrides for a in ("--set", o)],
            out,
            DASK_DISTRIBUTED__WORKER__PRELOAD=repr(preloads),
            LLMRL_TEST_FAULT_MARKER=str(marker),
            LLMRL_TEST_HANG_VERSION="2",
            LLMRL_VERBOSE="0",  # the console a user sees (the tests' default shows every library's log)
        )
    try:
        code = proc.wait(timeout=900)
    finally:
        # multiprocessing's resource tracker outlives its clients by the moment it takes to clean up after them (the
        # killed worker's semaphore): what is still there after a few seconds was left behind
        members = [p for p in psutil.process_iter() if _in_group(p, proc.pid)]
        psutil.wait_procs(members, timeout=15)
        left = [(p, _describe(p)) for p in members if _in_group(p, proc.pid)]
        for p, _ in left:
            p.send_signal(signal.SIGKILL)
    took = time.monotonic() - start
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert marker.exists(), "the kill did not happen"
    restarts = [line for line in text.splitlines() if "Restart 1 of 1 (dask.restarts)" in line]
    assert len(restarts) == 1 and "rollout worker tcp://127.0.0.1:" in restarts[0], text[-3000:]
    assert "rollout of version 1" in restarts[0], restarts[0]
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-3000:]
    assert "the rollout worker tcp://127.0.0.1:" in errors[0]
    assert "stopped answering during rollout of version 2: no heartbeat for" in errors[0]
    silent = float(errors[0].split("no heartbeat for ")[1].split(" s")[0])
    assert SILENT_LIMIT_S <= silent < SILENT_LIMIT_S + 30, errors[0]
    print(f"hung worker named after {silent:.0f} s of silence; the whole run took {took:.0f} s")
    # the libraries' echoes of the lost workers (tracebacks, closed connections) went to the run's log files
    assert "Traceback" not in text and "CommClosedError" not in text, text[-3000:]
    assert not left, f"processes left behind: {[d for _, d in left]}"
    state = tmp_path / "runs" / "heal" / "state"
    assert sorted(p.name for p in state.glob("published-v*.json")) == [f"published-v{v}.json" for v in range(3)]
    store = TrajectoryStore(tmp_path / "runs" / "trajectories")
    assert store.versions("heal") == [0, 1]
    for version in (0, 1):
        records = store.read_records("heal", version=version)
        assert len(records) == 4, (version, len(records))  # 2 prompts x 2 samples, once each


def _describe(process) -> str:
    """A process's state and command line, for an assertion message."""
    try:
        return f"{process.pid} {process.status()} {' '.join(process.cmdline())[:160]}"
    except Exception as exc:  # noqa: BLE001 - gone meanwhile
        return f"{process.pid} ({exc})"


def _in_group(process, pgid: int) -> bool:
    """Whether ``process`` still runs in process group ``pgid`` (gone, a zombie awaiting its reaper, or unreadable:
    False)."""
    import os

    import psutil

    try:
        return os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, PermissionError, psutil.Error):
        return False


def test_placement_is_by_declared_resources():
    from runtime.cluster import place_workers
    from runtime.placement_plan import local_worker_resources

    cfg = load_config(GRPOConfig, None, ["rollout.workers=2", "train.device=cpu"])
    assert local_worker_resources(cfg) == {
        "rollout-0": {"ROLLOUT": 1},
        "rollout-1": {"ROLLOUT": 1},
        "trainer": {"TRAINER": 1},
    }
    gpu = load_config(GRPOConfig, None, ["train.device=cuda"])
    assert local_worker_resources(gpu)["trainer"] == {"TRAINER": 1, "GPU": 1}
    workers = {
        "tcp://a:1": {"resources": {"ROLLOUT": 1}},
        "tcp://b:1": {"resources": {"GPU": 1}},
        "tcp://c:1": {"resources": {"ROLLOUT": 1}},
    }
    assert place_workers(workers, 1) == (["tcp://a:1"], ["tcp://b:1"])
    assert place_workers(workers, 2) == (["tcp://a:1", "tcp://c:1"], ["tcp://b:1"])
    with pytest.raises(RuntimeError, match="must declare resources"):
        place_workers({"tcp://a:1": {}, "tcp://b:1": {}}, 1)


def test_data_parallel_ranks_get_workers_of_their_own():
    """train.data_parallel=N: N trainer workers (the local cluster's named by rank, rank 0 ``trainer``), each with
    its share of the trainer's cores on CPU and a GPU of its own on CUDA; too few GPUs is refused by name."""
    from runtime.cluster import place_workers
    from runtime.placement_plan import gpu_assignment, local_worker_resources, worker_threads

    cfg = load_config(GRPOConfig, None, ["train.data_parallel=2", "train.device=cpu"])
    assert list(local_worker_resources(cfg)) == ["rollout-0", "trainer", "trainer-1"]
    assert worker_threads(cfg, gpu_assignment(cfg, 0), cores=4) == {"rollout-0": 4, "trainer": 2, "trainer-1": 2}
    workers = {  # the local cluster's workers carry their names; the ranks follow them, not the addresses
        "tcp://a:1": {"name": "trainer-1", "resources": {"TRAINER": 1}},
        "tcp://b:1": {"name": "rollout-0", "resources": {"ROLLOUT": 1}},
        "tcp://c:1": {"name": "trainer", "resources": {"TRAINER": 1}},
    }
    assert place_workers(workers, 1, 2) == (["tcp://b:1"], ["tcp://c:1", "tcp://a:1"])
    with pytest.raises(RuntimeError, match=r"train.data_parallel=3"):
        place_workers(workers, 1, 3)
    gpu = load_config(GRPOConfig, None, ["train.data_parallel=2", "train.device=cuda"])
    assert gpu_assignment(gpu, 3).visible == {"trainer": "0", "trainer-1": "1", "rollout-0": "2"}
    with pytest.raises(ValueError, match=r"train.data_parallel=2 puts each trainer rank on a GPU of its own.*3 GPUs"):
        gpu_assignment(gpu, 2)
    with pytest.raises(ValueError, match=r"train.data_parallel must be >= 1"):
        load_config(GRPOConfig, None, ["train.data_parallel=0"])


def _reference_logprobs(model, record, temperature):
    """Independent reference: one unpacked forward of prompt + response, logits / T, log-softmax."""
    ids = torch.tensor([list(record.prompt_tokens) + list(record.response_tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(record.prompt_tokens) - 1 : -1] / temperature
    targets = torch.tensor(record.response_tokens)[:, None]
    return torch.log_softmax(logits, -1).gather(-1, targets).squeeze(-1)


@pytest.mark.slow
@pytest.mark.parametrize("kl_in", ["loss", pytest.param("reward", marks=pytest.mark.extended)])
def test_reference_kl_in_the_loss_or_the_reward(tmp_path, default_model_path, kl_in):
    """2 iterations with kl_coef > 0 at T = 0.7 on an fp32 engine: stored ref_logprobs equal an independent
    transformers computation, the KL lands in the loss or in the returns, and sampler/trainer agree."""
    from transformers import AutoModelForCausalLM

    from flows.grpo import grpo
    from llmrl_core.objectives import mc_advantage
    from storage.trajectories import TrajectoryStore

    coef = 0.05
    grpo(
        overrides=_tiny(
            tmp_path, "progress=false", "rollout.temperature=0.7", f"train.kl_coef={coef}", f"train.kl_in={kl_in}"
        )
    )
    runs = tmp_path / "runs"
    store = TrajectoryStore(runs / "trajectories")
    reference = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    for version in (0, 1):
        records = store.read_records("t1", version=version)
        assert len(records) == 4
        for record in records:
            assert record.sampling_params["logprobs_mode"] == "processed_logprobs"
            assert record.sampling_params["temperature"] == pytest.approx(0.7)
            expected = _reference_logprobs(reference, record, 0.7)
            assert (expected - torch.tensor(record.ref_logprobs)).abs().max().item() < 1e-3
            if kl_in == "reward":
                kl = sum(s - r for s, r in zip(record.sampler_logprobs, record.ref_logprobs, strict=True))
                assert record.reward_components["kl_penalty"] == pytest.approx(-coef * kl, abs=1e-5)
            else:
                assert "kl_penalty" not in record.reward_components
        returns = [r.reward + r.reward_components.get("kl_penalty", 0.0) for r in records]
        expected_adv = mc_advantage(returns, [r.group_id for r in records]).advantages.tolist()
        assert [r.advantage for r in records] == pytest.approx(expected_adv, abs=1e-5)
        metrics = json.loads((runs / "t1" / "state" / f"published-v{version + 1}.json").read_text())["metrics"]
        assert metrics["agreement_abs_diff_mean"] < 1e-3, metrics  # fp32 engine, same temperature
        assert metrics["agreement_off"] == 0.0
        assert ("kl_to_ref" in metrics) == (kl_in == "loss")
        assert metrics["ref_seconds"] > 0
        # what the publish of this version cost: the weights file (shared memory here), the engine load, the seal
        assert metrics["publish_write_s"] > 0 and metrics["publish_load_s"] > 0 and metrics["seal_s"] > 0
    # version 0's rollouts came from the reference weights themselves: KL(sampler || ref) ~ 0 there
    v0 = store.read_records("t1", version=0)
    assert max(abs(s - r) for rec in v0 for s, r in zip(rec.sampler_logprobs, rec.ref_logprobs, strict=True)) < 2e-2


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.temperature=-1", "rollout.temperature must be > 0"),
        ("rollout.temperature=0", "rollout.temperature must be > 0"),
        ("rollout.top_p=1.5", r"rollout.top_p must be <= 1, got 1.5"),
        ("rollout.dtype=float8", "rollout.dtype: must be one of"),
        ("rollout.logprobs_mode=processed_logits", "rollout.logprobs_mode: must be one of"),
        ("train.tis.cap=0", "train.tis.cap must be > 0"),
        ("train.tis.mode=clip", "train.tis.mode: must be one of"),
        ("train.tis.level=token_sum", "train.tis.level: must be one of"),
        ("train.importance_level=group", "train.importance_level: must be one of"),
        ("train.advantage=ppo", "train.advantage: must be one of"),
        ("train.kl_in=advantage", "train.kl_in: must be one of"),
        ("train.kl_coef=-0.1", "train.kl_coef must be >= 0"),
        ("train.objective=dpo", "train.objective: must be one of"),
        ("train.clip_epsilon=1.5", r"train.clip_epsilon must be < 1, got 1.5"),
        ("train.clip_epsilon_high=-0.1", "train.clip_epsilon_high must be >= 0"),
        ("train.lora.r=0", "train.lora.r must be >= 1"),
        ("train.agreement_warn=0", "train.agreement_warn must be > 0"),
        ("train.aggregation=none", "train.aggregation: must be one of"),
    ],
)
def test_bad_loss_and_sampling_options_fail_before_anything_starts(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, None, [override])


def test_option_words_that_yaml_reads_as_booleans_are_accepted():
    cfg = load_config(GRPOConfig, None, ["train.mixed_precision=no"])
    assert cfg.train.mixed_precision == "no"


def test_train_config_selects_the_loss_options():
    cfg = load_config(
        GRPOConfig,
        None,
        [
            "train.clip_epsilon=0.2",
            "train.clip_epsilon_high=0.28",
            "train.importance_level=sequence",
            "train.aggregation=sequence_sum",
            "train.tis.cap=2",
            "train.tis.mode=mask",
            "train.tis.level=sequence",
            "train.kl_coef=0.1",
            "train.kl_in=reward",
            "train.objective=cispo",
            "rollout.max_new_tokens=64",
        ],
    )
    options = cfg.train.loss_options(cfg.rollout.max_new_tokens)
    assert options["clip_epsilon"] == (0.2, 0.28)
    assert options["importance_level"] == "sequence" and options["objective"] == "cispo"
    assert options["aggregation"] == "sequence_sum" and options["norm_constant"] == 64.0
    assert (options["tis_cap"], options["tis_mode"], options["tis_level"]) == (2.0, "mask", "sequence")
    assert "kl_to_ref_coeff" not in options  # kl_in=reward: the KL goes into the returns, not the loss
    in_loss = load_config(GRPOConfig, None, ["train.kl_coef=0.1"]).train.loss_options(128)
    assert in_loss["kl_to_ref_coeff"] == 0.1 and "tis_cap" not in in_loss


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", pytest.param("Ctrl-C", marks=pytest.mark.extended)])
def test_a_stop_signal_ends_the_run_cleanly(tmp_path, how):
    """SIGTERM to `llmrl run grpo` mid-run, or a terminal's Ctrl-C (SIGINT to its whole process group, the local
    Dask workers included): it exits (143 / 130) within a minute, with its Dask workers, engines and its Prefect API
    all gone, the MLflow run marked KILLED and the Prefect flow run Cancelled; what was published stays
    published."""
    import os
    import signal
    import time

    import psutil
    from mlflow import MlflowClient

    run_id = f"t-{how.lower()}"
    overrides = [*_tiny(tmp_path, "progress=false"), f"run_id={run_id}"]
    runs = tmp_path / "runs"
    published = runs / run_id / "state" / "published-v0.json"
    args = ["--config", "recipes/gsm8k-demo.yaml", *(a for o in overrides for a in ("--set", o))]
    proc = _start_cli_run(args, (tmp_path / "flow.log").open("w"), own_prefect_api=True)  # its API ends with it
    try:
        deadline = time.monotonic() + 600
        while not published.exists():  # engines and trainer are resident once version 0 is published
            assert proc.poll() is None, f"the flow exited ({proc.returncode}) before publishing version 0"
            assert time.monotonic() < deadline, "version 0 was never published"
            time.sleep(0.2)
        family = psutil.Process(proc.pid).children(recursive=True)
        commands = " ".join(" ".join(p.cmdline()) for p in family)
        assert "dask" in commands and "llmrl_cli.api_child" in commands, commands  # workers and the run's API
        signum = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
        stopped = time.monotonic()
        if how == "SIGTERM":
            proc.send_signal(signum)
        else:
            os.killpg(proc.pid, signum)
        assert proc.wait(timeout=90) == 128 + signum, (tmp_path / "flow.log").read_text()[-3000:]
        _, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, f"left running after {how}: {[' '.join(p.cmdline())[:80] for p in alive]}"
        took = time.monotonic() - stopped
        print(f"{how}: the run and all its processes ended {took:.1f} s after the signal")
        assert took < 30, (tmp_path / "flow.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    assert run.info.status == "KILLED"
    assert published.exists()
    # Prefect shows the run as what it was: cancelled by the user, not crashed
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as prefect:
        (flow_run,) = prefect.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"run:{run_id}"]))
        )
        history = [state.type.value for state in prefect.read_flow_run_states(flow_run.id)]
    says = "stopped by SIGTERM" if how == "SIGTERM" else "stopped by Ctrl-C"
    assert flow_run.state.type.value == "CANCELLED" and flow_run.state.message == says
    # straight from Running to Cancelled, and the console says no crash (issue 71: "Crash detected!" ERROR lines)
    assert "CRASHED" not in history and history[-2:] == ["RUNNING", "CANCELLED"], history
    console = (tmp_path / "flow.log").read_text()
    assert "Crash detected" not in console and "Finished in state Cancelled" in console, console[-3000:]


@pytest.mark.engine
def test_a_killed_run_leaves_no_prefect_api_behind(tmp_path):
    """``kill -9`` of `llmrl run`: its Prefect API ends with it (the kernel's parent-death signal), instead of
    serving on for good."""
    import contextlib
    import os
    import signal
    import time

    import psutil

    args = ["--set", f"runs_dir={tmp_path / 'runs'}", "--set", "run_id=t-kill9", "--set", "progress=false"]
    proc = _start_cli_run(args, own_prefect_api=True)
    try:
        deadline = time.monotonic() + 120
        while not (api := [c for c in psutil.Process(proc.pid).children() if "llmrl_cli.api_child" in c.cmdline()]):
            assert proc.poll() is None and time.monotonic() < deadline, "the run's Prefect API never started"
            time.sleep(0.1)
        time.sleep(1.0)  # past its start-up check of the parent
        proc.kill()
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(api, timeout=20)
        assert not alive, "the run's Prefect API outlived the killed run"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever else of the run was still starting
        proc.wait(timeout=30)
