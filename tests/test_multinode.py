"""GRPO on a Dask cluster the flow joins (``dask.address``), with every process standing in for its own node.

A ``dask scheduler`` and three ``dask worker`` processes (two with ``ROLLOUT=1``, one with ``TRAINER=1``) are
started by hand on 127.0.0.1, each with its own ``LLMRL_HOME`` and ``HOME`` (nothing of the flow host's caches
is visible to them: each node resolves the packaged model itself). ``llmrl run grpo --set dask.address=...``
then runs two iterations on them; both engines must have rolled out every version, versions 1 and 2 must be
published, and every process must be gone at the end. A second flow host (its own ``LLMRL_HOME``, nothing of the
first one's disk) then resumes the run with ``iterations=4``: from the commit markers the first host copied into
the bucket, at version 2, with no rollout repeated or lost (and the workers' memory is the same after both runs).
While it trains version 3 it loses the trainer's node (a preload kills the node's whole process group); the flow
names the lost worker, waits for a replacement node (``dask.join_wait_s``), which the test starts, and heals:
version 4 published, every version's rows exactly once.

No node shares a disk with another: ``runs_dir`` is an S3 bucket (moto on 127.0.0.1), where the workers write and
read the trajectories, staging shards, checkpoints and trainer state; the flow host keeps its own records (config,
commit markers, reports, MLflow) under its own ``LLMRL_HOME``. Each worker runs in a mount namespace in which the
flow host's folder and the test's own ``~/.cache`` are replaced by empty tmpfs mounts, so a worker that tried to
read either would find nothing (where ``unshare`` is not permitted, the test says so and checks the files alone).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL_NAME = "SmolLM2-135M-Instruct"


def _node_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of one "node": the test session's settings (offline, small KV cache) with its own homes."""
    drop = ("LLMRL_", "PREFECT_API_", "DASK_", "OMP_", "MKL_", "OPENBLAS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    home.mkdir(parents=True, exist_ok=True)
    env.update(extra)
    env.update(
        HOME=str(home),
        LLMRL_HOME=str(home / "llmrl"),
        PREFECT_HOME=str(home / "prefect"),
        XDG_CACHE_HOME=str(home / ".cache"),
        PYTHONUNBUFFERED="1",
    )
    return env


def _install_model(source: str, home: Path) -> Path:
    """Put the prepared packaged model into a node's ``$LLMRL_HOME/models`` (hard links where possible), as
    ``llmrl models prepare`` would have left it on that node."""
    target = home / "llmrl" / "models" / MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link_or_copy)
    return target


def _can_hide_folders() -> bool:
    """Whether this machine lets the test start a process in a private mount namespace (``unshare -m``, root)."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


def _hidden(cmd: list[str], folders: list[Path]) -> list[str]:
    """``cmd`` in a private mount namespace where each of ``folders`` is an empty tmpfs (what the worker sees
    of the flow host's disk: nothing)."""
    mounts = " && ".join(f"mount -t tmpfs -o size=1m none '{f}'" for f in folders)
    return ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"', "sh", *cmd]


def _start(cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    """Start a process in its own session (so a kill of its group reaches its children), output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _group_members(pgid: int) -> list[Any]:
    """The live processes of a process group."""
    import psutil

    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _stop(procs: list[subprocess.Popen], timeout: float = 60.0) -> list[str]:
    """SIGTERM every process group (workers before the scheduler), SIGKILL what is left after ``timeout``;
    returns what had to be killed."""
    import psutil

    family = {p.pid: _group_members(p.pid) for p in procs}
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    killed = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _, alive = psutil.wait_procs(family[proc.pid], timeout=max(1.0, deadline - time.monotonic()))
        for member in [*alive, *_group_members(proc.pid)]:
            try:
                killed.append(" ".join(member.cmdline())[:120])
                member.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return killed


def _tail(path: Path, chars: int = 6000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} missing)"


def _thread_settings_on_worker() -> Any:
    """A function for ``Client.run`` (local, so it travels by value: the workers cannot import this test file)."""

    def thread_settings(dask_worker: Any) -> dict[str, Any]:
        """What a worker process gives torch (and so an in-process CPU vLLM engine) to compute with."""
        import os

        import torch

        return {
            "resources": dict(dask_worker.state.total_resources),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(),
            "cpus": len(os.sched_getaffinity(0)),
            "LLMRL_HOME": os.environ.get("LLMRL_HOME"),
        }

    return thread_settings


def _actor_count_on_worker() -> Any:
    """A function for ``Client.run``: how many actors the worker holds."""

    def actor_count(dask_worker: Any) -> int:
        return len(dask_worker.state.actors)

    return actor_count


def _rss_on_worker() -> Any:
    """A function for ``Client.run``: the worker process's resident memory in MiB (after a full collection)."""

    def rss_mib(dask_worker: Any) -> float:
        import gc

        import psutil

        gc.collect()
        return psutil.Process().memory_info().rss / 2**20

    return rss_mib


def _rollout_rss(address: str, names: dict[str, str]) -> dict[str, float]:
    """Each rollout worker's resident MiB once no actor is resident on any worker (they are closed and released
    as a flow's client leaves; waits up to a minute for that)."""
    from dask.distributed import Client

    with Client(address, timeout=60) as client:
        deadline = time.monotonic() + 60
        while resident := {a: n for a, n in client.run(_actor_count_on_worker()).items() if n}:
            assert time.monotonic() < deadline, f"actors still resident after the flow ended: {resident}"
            time.sleep(0.5)
        return {
            names[a]: rss for a, rss in client.run(_rss_on_worker()).items() if names.get(a, "").startswith("rollout")
        }


def _with(settings: list[str], **changes: object) -> list[str]:
    """``settings`` (``key=value`` items) with ``changes`` applied."""
    kept = [item for item in settings if item.partition("=")[0] not in changes]
    return kept + [f"{key}={value}" for key, value in changes.items()]


def _start_flow(
    host: str, settings: list[str], nodes: dict[str, Path], logs: dict[str, Path], procs: list, s3_server: Any
) -> subprocess.Popen:
    """``llmrl run grpo`` on flow host ``host`` (its own ``LLMRL_HOME``) against the cluster, started."""
    flow = _start(
        [str(BIN / "llmrl"), "run", "grpo", *(a for s in settings for a in ("--set", s))],
        _node_env(nodes[host], **s3_server.env),
        logs[host],
        REPO,
    )
    procs.insert(0, flow)
    return flow


def _finish_flow(flow: subprocess.Popen, host: str, logs: dict[str, Path], start: float) -> subprocess.Popen:
    """Wait for a started flow to succeed (the logs of every node on failure)."""
    try:
        code = flow.wait(timeout=max(1.0, 900 - (time.perf_counter() - start)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the flow on {host} did not finish in 15 minutes:\n" + _tail(logs[host]))
    print(f"{host}: {time.perf_counter() - start:.1f} s")
    for line in logs[host].read_text(errors="replace").splitlines():  # where the time went (pytest -s)
        if any(key in line for key in ("resident", "published", "Created flow run", "Finished in state", "Restart")):
            print(line[:200])
    assert code == 0, "\n".join(f"--- {n}\n{_tail(p, 3000)}" for n, p in logs.items() if p.exists())
    return flow


def _run_flow(
    host: str, settings: list[str], nodes: dict[str, Path], logs: dict[str, Path], procs: list, s3_server: Any
) -> subprocess.Popen:
    """``llmrl run grpo`` on flow host ``host`` against the cluster; waits for it to succeed and returns it."""
    start = time.perf_counter()
    return _finish_flow(_start_flow(host, settings, nodes, logs, procs, s3_server), host, logs, start)


@pytest.mark.slow
@pytest.mark.xdist_group("dev-shm")  # see tests/conftest.py
def test_grpo_on_a_joined_cluster_of_separate_nodes(tmp_path, default_model_path, s3_server):
    from dask.distributed import Client

    from storage.checkpoints import CheckpointStore
    from storage.trajectories import TrajectoryStore

    nodes = {
        name: tmp_path / name
        for name in ("scheduler", "rollout-0", "rollout-1", "trainer", "trainer-2", "flow", "flow-2")
    }
    lost_marker = tmp_path / "trainer-node-lost.txt"
    for name in ("rollout-0", "rollout-1", "trainer", "trainer-2"):
        _install_model(default_model_path, nodes[name])  # each node prepared the packaged model once
    runs = s3_server.uri("runs")  # the only place all nodes reach
    nodes["flow"].mkdir(parents=True)
    nodes["flow-2"].mkdir(parents=True)  # a second flow host, which resumes the run: no disk shared with the first
    hide = [nodes["flow"], nodes["flow-2"], Path.home() / ".cache"]
    hiding = _can_hide_folders()
    print("workers see the flow host's folder and ~/.cache as empty tmpfs:", hiding)
    procs: list[subprocess.Popen] = []
    logs = {name: tmp_path / f"{name}.log" for name in nodes}
    try:
        scheduler_file = tmp_path / "scheduler.json"
        procs.append(
            _start(
                [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
                + ["--scheduler-file", str(scheduler_file)],
                _node_env(nodes["scheduler"]),
                logs["scheduler"],
                nodes["scheduler"],
            )
        )
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            assert procs[0].poll() is None, _tail(logs["scheduler"])
            assert time.monotonic() < deadline, "the scheduler did not start:\n" + _tail(logs["scheduler"])
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written in one go, but give the writer a moment
        address = json.loads(scheduler_file.read_text())["address"]
        # CPU threads: the nanny starts a worker with Dask's OMP_NUM_THREADS=MKL_NUM_THREADS=1 unless the node
        # exported its own (distributed.nanny.pre-spawn-environ yields to the environment); torch (built with MKL)
        # sizes its pool from MKL_NUM_THREADS, so both are exported: one per engine, both cores to train.
        threads = {"rollout-0": 1, "rollout-1": 1, "trainer": 2}

        def start_node(name: str, resources: str, *preload: str, **env: str) -> subprocess.Popen:
            """A ``dask worker`` "node": its own homes and scratch folder, the flow host's folders hidden."""
            scratch = nodes[name] / "dask-scratch"
            scratch.mkdir()
            node = _start(
                (lambda cmd: _hidden(cmd, hide) if hiding else cmd)(
                    [str(BIN / "dask"), "worker", address, "--host", "127.0.0.1", "--name", name]
                    + ["--nthreads", "1", "--memory-limit", "0", "--local-directory", str(scratch)]
                    + ["--resources", resources, "--no-dashboard", "--death-timeout", "60"]
                    + [a for path in preload for a in ("--preload", path)]
                ),
                _node_env(
                    nodes[name],
                    OMP_NUM_THREADS=str(threads[name]),
                    MKL_NUM_THREADS=str(threads[name]),
                    # the engines' start-up lines are read from these logs: a test that started an engine in
                    # this pytest process beside Prefect left VLLM_CONFIGURE_LOGGING=0 in os.environ
                    # (vllm_engine.py), which would silence them (no Prefect log handler on a worker)
                    VLLM_CONFIGURE_LOGGING="1",
                    **s3_server.env,
                    **env,
                ),
                logs[name],
                nodes[name],
            )
            procs.append(node)
            return node

        threads["trainer-2"] = threads["trainer"]
        start_node("rollout-0", "ROLLOUT=1")
        start_node("rollout-1", "ROLLOUT=1")
        # the trainer's node is lost the first time it is asked to train version 3 (the second flow run, below)
        trainer_node = start_node(
            "trainer",
            "TRAINER=1",
            str(REPO / "tests" / "fault_preloads" / "trainer_node_dies_once.py"),
            LLMRL_TEST_FAULT_MARKER=str(lost_marker),
            LLMRL_TEST_FAULT_VERSION="3",
        )
        with Client(address, timeout=60) as client:
            client.wait_for_workers(3, timeout=120)
            seen = client.run(_thread_settings_on_worker())
            names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
        rss = [_rollout_rss(address, names)]  # fresh workers, then after each flow run
        print("worker settings:", json.dumps(seen, indent=1))
        for info in seen.values():
            name = Path(info["LLMRL_HOME"]).parent.name
            assert info["LLMRL_HOME"] == str(nodes[name] / "llmrl")  # each node its own home
            assert info["OMP_NUM_THREADS"] == str(threads[name]) and info["torch_threads"] == threads[name], info

        settings = [
            "run_id=mn",
            f"runs_dir={runs}",
            f"dask.address={address}",
            "rollout.workers=2",
            "iterations=2",
            "data.prompts_per_iteration=2",
            "data.group_size=2",
            "rollout.max_new_tokens=16",
            "rollout.dtype=float32",
            "train.mixed_precision=no",
            "rollout.temperature=1.0",
            "keep_checkpoints=5",
            "final_eval.questions=0",
            "progress=false",
        ]
        flow = _run_flow("flow", settings, nodes, logs, procs, s3_server)
        assert "published version 2" in logs["flow"].read_text()
        assert not _group_members(flow.pid), "the flow left processes behind (e.g. its ephemeral Prefect API)"

        # the run's actors (engines, trainer) are released with the flow's client: the workers can serve the next run
        rss.append(_rollout_rss(address, names))

        # the flow host's own records, on its own disk
        local_run = nodes["flow"] / "llmrl" / "runs" / "mn"
        assert {f"published-v{v}.json" for v in (0, 1, 2)} <= {p.name for p in (local_run / "state").iterdir()}
        assert (local_run / "config.json").is_file()
        assert not [p for p in local_run.rglob("*") if p.suffix in (".safetensors", ".parquet", ".pt")]
        # the workers' data, in the bucket only
        assert CheckpointStore(s3_server.uri("runs/mn/checkpoints")).versions() == [0, 1, 2]
        keys = s3_server.keys("runs/")
        markers = [f"runs/mn/state/published-v{v}.json" for v in (0, 1, 2)]  # copies, for other flow hosts
        assert [k for k in keys if "/state/" in k] == [
            *markers,
            "runs/mn/state/trainer-v1.pt",
            "runs/mn/state/trainer-v2.pt",
        ]
        assert not [k for k in keys if "/staging/" in k]  # every staged batch was moved into the store
        store = TrajectoryStore(s3_server.uri("runs/trajectories"))
        assert store.versions("mn") == [0, 1]
        for version in (0, 1):
            shards = store.shards("mn", version=version)
            assert len({s.name for s in shards}) == 2, shards  # one shard per engine: both engines rolled out
            assert len(store.read_records("mn", version=version)) == 4
        # the flow host never resolved the model: the workers did, each under its own $LLMRL_HOME
        assert not (nodes["flow"] / "llmrl" / "models").exists()
        for name in ("rollout-0", "rollout-1"):  # the engine's start-up line names the model it loaded
            assert str(nodes[name] / "llmrl" / "models" / MODEL_NAME) in logs[name].read_text(errors="replace")

        # another flow host, with nothing of the first one's disk, resumes the run from the bucket (versions 3 and
        # 4), and loses the trainer's node while it trains version 3 (its nanny and worker killed, as a lost machine):
        # the flow names the lost worker in one line, waits (dask.join_wait_s) for a node with the same resources,
        # which the operator (here, the test) starts, and resumes from version 3 on it: the trainer state comes back
        # from the bucket, no row is lost or repeated
        start = time.perf_counter()
        flow = _start_flow(
            "flow-2", _with(settings, iterations=4, **{"dask.join_wait_s": 180}), nodes, logs, procs, s3_server
        )
        deadline = time.monotonic() + 600
        while not lost_marker.exists():
            assert flow.poll() is None, "the flow ended before the fault:\n" + _tail(logs["flow-2"])
            assert time.monotonic() < deadline, "the trainer was never asked to train version 3"
            time.sleep(0.5)
        trainer_node.wait(timeout=60)
        assert not _group_members(trainer_node.pid), "the lost trainer node left processes"
        start_node("trainer-2", "TRAINER=1")  # the replacement node, with nothing of the lost one's disk
        _finish_flow(flow, "flow-2", logs, start)
        text = logs["flow-2"].read_text(errors="replace")
        assert "resuming at version 2" in text and "versions [0, 1, 2] were committed from another flow host" in text
        restarts = [line for line in text.splitlines() if "Restart 1 of 2 (dask.restarts)" in line]
        assert len(restarts) == 1, text[-4000:]
        assert "the trainer worker tcp://127.0.0.1:" in restarts[0] and "training of version 3" in restarts[0]
        assert "published version 4" in text
        other_run = nodes["flow-2"] / "llmrl" / "runs" / "mn"
        assert {f"published-v{v}.json" for v in range(5)} <= {p.name for p in (other_run / "state").iterdir()}
        assert CheckpointStore(s3_server.uri("runs/mn/checkpoints")).versions() == [0, 1, 2, 3, 4]
        assert store.versions("mn") == [0, 1, 2, 3]
        for version in range(4):  # nothing repeated, nothing lost
            assert len(store.read_records("mn", version=version)) == 4, version
        keys = s3_server.keys("runs/mn/state/")
        assert keys == [
            *(f"runs/mn/state/published-v{v}.json" for v in range(5)),
            "runs/mn/state/trainer-v3.pt",
            "runs/mn/state/trainer-v4.pt",
        ]
        rss.append(_rollout_rss(address, names))

        # the engines' memory after two runs on the same workers (the second with a restart): each run closes its
        # engines before Dask drops them (an in-process vLLM engine dropped without its shutdown is never freed: vLLM
        # freezes the garbage collector's heap when it starts). Before that, a rollout worker kept ~1.4 GB more after
        # every run it had hosted; what stays is the libraries imported once (torch, vLLM: ~1 GB).
        print("rollout workers' resident MiB (fresh, after runs 1-2):", json.dumps(rss))
        for name in rss[0]:
            after = [round(r[name]) for r in rss[1:]]
            assert after[1] - after[0] < 300, f"{name} grew from run to run: {after} MiB"
            assert after[0] - rss[0][name] < 1200, f"{name} kept its engine after run 1: {after[0]} MiB"
        assert not [k for k in s3_server.keys("runs/") if "/staging/" in k]
    finally:
        leftovers = _stop(procs)
    assert not leftovers, f"processes needed SIGKILL: {leftovers}"
