"""GPU placement and CPU threads of the local cluster (runtime/placement_plan.py) and their settings."""

from __future__ import annotations

import pytest

from llmrl_core.modules.backends.types import EngineConfig
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig, RolloutConfig, TrainConfig
from llmrl_core.pipeline.sft_config import SFTConfig
from runtime.placement_plan import (
    THREAD_VARIABLES,
    available_cores,
    gpu_assignment,
    worker_environments,
)


def grpo(workers: int = 1, tp: int = 1, utilization: float | None = None, device: str = "auto") -> GRPOConfig:
    return GRPOConfig(
        rollout=RolloutConfig(workers=workers, tensor_parallel_size=tp, gpu_memory_utilization=utilization),
        train=TrainConfig(device=device),
    )


def gpus_of(visible: str) -> set[str]:
    return set(visible.split(",")) if visible else set()


# ---- the settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ("tensor_parallel_size=0", "rollout.tensor_parallel_size must be >= 1, got 0"),
        ("gpu_memory_utilization=0.0", "rollout.gpu_memory_utilization must be > 0, got 0.0"),
        ("gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization must be <= 1, got 1.5"),
        ("gpu_memory_utilization=.nan", "rollout.gpu_memory_utilization must be a finite number, got nan"),
        ("threads=-1", "rollout.threads must be >= 0, got -1"),
    ],
)
def test_rollout_scale_settings_are_checked(overrides: str, setting: str) -> None:
    with pytest.raises(ValueError, match=setting):
        load_config(GRPOConfig, None, [f"rollout.{overrides}"])


def test_rollout_scale_defaults_keep_todays_engine() -> None:
    r = RolloutConfig()
    assert (r.tensor_parallel_size, r.gpu_memory_utilization, r.threads) == (1, None, 0)
    assert RolloutConfig(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0


def test_scale_settings_from_overrides() -> None:
    cfg = load_config(
        GRPOConfig,
        overrides=["rollout.tensor_parallel_size=2", "rollout.gpu_memory_utilization=0.3", "rollout.threads=3"],
    )
    assert (cfg.rollout.tensor_parallel_size, cfg.rollout.gpu_memory_utilization, cfg.rollout.threads) == (2, 0.3, 3)


def test_engine_config_refuses_tensor_parallel_on_cpu() -> None:
    EngineConfig(device="cpu").check_parallelism()  # tp 1: fine
    EngineConfig(device="cuda", tensor_parallel_size=4).check_parallelism()  # CUDA: vLLM's to run
    with pytest.raises(ValueError, match="rollout.tensor_parallel_size=1"):
        EngineConfig(device="cpu", tensor_parallel_size=2).check_parallelism()
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=0)


def test_rollout_worker_passes_the_settings_to_its_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """RolloutWorker's constructor builds the EngineConfig from the rollout section (the engine start is stubbed)."""
    import runtime.rollout_actor as actors

    seen: list[EngineConfig] = []

    def fake_init(self, env_factory, engine, sampling, policy_class=None, policy_kwargs=None) -> None:
        seen.append(engine)

    monkeypatch.setattr(actors.RolloutActor, "__init__", fake_init)
    monkeypatch.setattr("llmrl_core.model_store.resolve_model", lambda model: model)
    monkeypatch.setattr("llmrl_core.modules.backends.types.cuda_available", lambda: True)
    actors.RolloutWorker(grpo(tp=2, utilization=0.25), "/models/m")
    actors.RolloutWorker(grpo(), "/models/m")
    assert (seen[0].tensor_parallel_size, seen[0].gpu_memory_utilization) == (2, 0.25)
    assert (seen[1].tensor_parallel_size, seen[1].gpu_memory_utilization) == (1, EngineConfig.gpu_memory_utilization)
    monkeypatch.setattr("llmrl_core.modules.backends.types.cuda_available", lambda: False)
    with pytest.raises(ValueError, match="rollout.tensor_parallel_size"):
        actors.RolloutWorker(grpo(tp=2), "/models/m")


# ---- GPU assignment (pure) --------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("tp", [1, 2])
def test_no_gpus_sets_nothing_and_tp_needs_gpus(workers: int, tp: int) -> None:
    if tp == 1:
        assert gpu_assignment(grpo(workers, tp), 0).visible == {}
    else:
        with pytest.raises(ValueError, match="rollout.tensor_parallel_size=2 .*has none"):
            gpu_assignment(grpo(workers, tp), 0)


@pytest.mark.parametrize(
    ("workers", "tp", "n_gpus", "expected"),
    [
        # one GPU: everything shares GPU 0 (today's behaviour)
        (1, 1, 1, {"rollout-0": "0", "trainer": "0"}),
        (2, 1, 1, {"rollout-0": "0", "rollout-1": "0", "trainer": "0"}),
        # dedicated GPUs: trainer first, then one block of tp per engine
        (1, 1, 2, {"rollout-0": "1", "trainer": "0"}),
        (1, 1, 4, {"rollout-0": "1", "trainer": "0"}),
        (2, 1, 4, {"rollout-0": "1", "rollout-1": "2", "trainer": "0"}),
        (1, 2, 4, {"rollout-0": "1,2", "trainer": "0"}),
        (2, 2, 8, {"rollout-0": "1,2", "rollout-1": "3,4", "trainer": "0"}),
        (3, 2, 8, {"rollout-0": "1,2", "rollout-1": "3,4", "rollout-2": "5,6", "trainer": "0"}),
        (4, 1, 8, {"rollout-0": "1", "rollout-1": "2", "rollout-2": "3", "rollout-3": "4", "trainer": "0"}),
        # too few GPUs: shared, fewest engines per GPU
        (2, 1, 2, {"rollout-0": "0", "rollout-1": "1", "trainer": "0"}),
        (1, 2, 2, {"rollout-0": "0,1", "trainer": "0"}),
        (2, 2, 2, {"rollout-0": "0,1", "rollout-1": "0,1", "trainer": "0"}),
        (2, 2, 4, {"rollout-0": "0,1", "rollout-1": "2,3", "trainer": "0"}),
    ],
)
def test_gpu_assignment(workers: int, tp: int, n_gpus: int, expected: dict[str, str]) -> None:
    got = gpu_assignment(grpo(workers, tp), n_gpus)
    assert got.visible == expected
    for i in range(workers):  # an engine's shards are distinct GPUs, as many as tensor_parallel_size
        assert len(gpus_of(got.visible[f"rollout-{i}"])) == tp
    assert any("is shared by" in note for note in got.notes) == (workers * tp + 1 > n_gpus)  # a log line each


@pytest.mark.parametrize("n_gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("tp", [1, 2])
def test_dedicated_gpus_are_disjoint_whenever_they_suffice(n_gpus: int, tp: int) -> None:
    for workers in range(1, 9):
        if workers * tp + 1 > n_gpus:
            continue
        got = gpu_assignment(grpo(workers, tp), n_gpus).visible
        used = [g for visible in got.values() for g in visible.split(",")]
        assert len(used) == len(set(used)) == workers * tp + 1
        assert got["trainer"] == "0"


def test_tp_larger_than_the_gpus_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel_size=2 needs 2 distinct GPUs .* has 1"):
        gpu_assignment(grpo(1, 2), 1)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=8 .* has 4"):
        gpu_assignment(grpo(1, 8), 4)


def test_shared_engines_must_fit_in_memory() -> None:
    with pytest.raises(ValueError, match=r"rollout.gpu_memory_utilization <= 0.33"):
        gpu_assignment(grpo(3), 1)  # 3 engines x default 0.4 on one GPU
    got = gpu_assignment(grpo(3, utilization=0.25), 1)
    assert set(got.visible.values()) == {"0"}
    assert any("GPU 0 is shared by rollout-0, rollout-1, rollout-2, trainer" in n and "0.75" in n for n in got.notes)
    # 2 GPUs, 3 engines: two on one GPU, one with the trainer on the other
    got = gpu_assignment(grpo(3), 2).visible
    assert sorted(got[f"rollout-{i}"] for i in range(3)) == ["0", "0", "1"] and got["trainer"] == "1"
    # Transformers engines reserve no share of the GPU: three fit beside the trainer (llmrl plan sizes them)
    hf = GRPOConfig(rollout=RolloutConfig(workers=3, backend="transformers"))
    (note,) = gpu_assignment(hf, 1).notes
    assert "GPU 0 is shared by rollout-0, rollout-1, rollout-2, trainer" in note and "nothing reserved" in note


def test_host_gpu_list_and_cpu_trainer() -> None:
    got = gpu_assignment(grpo(1), ["2", "5"]).visible
    assert got == {"rollout-0": "5", "trainer": "2"}
    got = gpu_assignment(grpo(2, device="cpu"), 2).visible  # a CPU trainer sees no GPU; the engines share none
    assert got == {"rollout-0": "0", "rollout-1": "1", "trainer": ""}
    trainer_only = SFTConfig()
    assert gpu_assignment(trainer_only, 4, rollout_workers=0).visible == {"trainer": "0"}


def test_unused_gpus_are_logged() -> None:
    assert any("GPUs 2,3,4,5,6,7 are not used" in n for n in gpu_assignment(grpo(1), 8).notes)


# ---- CPU threads ------------------------------------------------------------------------------------------


def test_cpu_workers_get_the_cores() -> None:
    envs, _ = worker_environments(grpo(1), 0, cores=8)
    assert envs["rollout-0"] == dict.fromkeys(THREAD_VARIABLES, "8")
    assert envs["trainer"] == dict.fromkeys(THREAD_VARIABLES, "8")
    envs, _ = worker_environments(grpo(2), 0, cores=8)
    assert envs["rollout-0"]["OMP_NUM_THREADS"] == envs["rollout-1"]["OMP_NUM_THREADS"] == "4"
    envs, _ = worker_environments(grpo(3), 0, cores=2)
    assert envs["rollout-2"]["OMP_NUM_THREADS"] == "1"
    cfg = load_config(GRPOConfig, overrides=["rollout.workers=2", "rollout.threads=3", "train.threads=5"])
    envs, _ = worker_environments(cfg, 0, cores=8)
    assert envs["rollout-1"]["OMP_NUM_THREADS"] == "3" and envs["trainer"]["MKL_NUM_THREADS"] == "5"


def test_asynchronous_runs_split_the_cores_between_engines_and_trainer() -> None:
    def threads(workers: int, cores: int, *extra: str) -> dict[str, str]:
        cfg = load_config(GRPOConfig, overrides=[f"rollout.workers={workers}", "rollout.max_staleness=1", *extra])
        envs, _ = worker_environments(cfg, 0, cores=cores)
        return {name: env["OMP_NUM_THREADS"] for name, env in envs.items()}

    assert threads(2, 2) == {"rollout-0": "1", "rollout-1": "1", "trainer": "1"}  # the measured best on 2 cores
    assert threads(1, 8) == {"rollout-0": "4", "trainer": "4"}
    assert threads(3, 16) == {"rollout-0": "4", "rollout-1": "4", "rollout-2": "4", "trainer": "4"}
    assert threads(1, 8, "train.threads=6") == {"rollout-0": "4", "trainer": "6"}  # given counts win
    cfg = load_config(GRPOConfig, overrides=["rollout.workers=1", "rollout.max_staleness=1"])
    envs, _ = worker_environments(cfg, 2, cores=16)  # engines and trainer on their own GPUs: nothing shared
    assert envs == {"rollout-0": {"CUDA_VISIBLE_DEVICES": "1"}, "trainer": {"CUDA_VISIBLE_DEVICES": "0"}}


def test_gpu_workers_keep_dask_threads() -> None:
    envs, _ = worker_environments(grpo(1), 2, cores=16)
    assert envs == {"rollout-0": {"CUDA_VISIBLE_DEVICES": "1"}, "trainer": {"CUDA_VISIBLE_DEVICES": "0"}}
    envs, _ = worker_environments(grpo(1, device="cpu"), 2, cores=16)
    assert envs["trainer"] == {"CUDA_VISIBLE_DEVICES": "", **dict.fromkeys(THREAD_VARIABLES, "16")}


PROBE = """
import torch  # imported by __main__ before the cluster starts, as a script or CLI may: the spawned workers do too

import json
import os, os, sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])


def probe():
    import torch

    return {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")} | {
        "torch": torch.get_num_threads()
    }


if __name__ == "__main__":
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from runtime.cluster import dask_cluster

    cfg = load_config(GRPOConfig, overrides=["rollout.workers=1", "rollout.threads=3", "train.device=cpu"])
    with dask_cluster(cfg, Path(sys.argv[2])) as place:
        seen = place.client.run(probe)
        print("PROBE " + json.dumps({"rollout": seen[place.rollout[0]], "trainer": seen[place.trainer]}))
"""


@pytest.mark.engine
@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="CPU threads of CPU workers (a GPU host keeps Dask's 1)"
)
def test_local_cluster_workers_run_with_their_threads(tmp_path) -> None:
    """Dask's Nanny starts workers with OMP_NUM_THREADS=1; the local cluster's CPU workers get their own counts,
    also in torch when the flow's __main__ imported torch (the workers import it before the Nanny's env applies)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, str(script), str(repo), str(tmp_path / "dask")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    seen = json.loads(lines[0].removeprefix("PROBE "))
    cores = str(available_cores())
    # the count asked for, also in torch: the workers start concurrently and Dask's pre-spawn export of the thread
    # variables is process-wide, so torch's import-time sizing may have read another worker's count (CI saw 1)
    torch_rollout = 3
    assert seen["rollout"] == {
        "OMP_NUM_THREADS": "3",
        "MKL_NUM_THREADS": "3",
        "CUDA_VISIBLE_DEVICES": None,
        "torch": torch_rollout,
    }
    assert seen["trainer"] == {
        "OMP_NUM_THREADS": cores,
        "MKL_NUM_THREADS": cores,
        "CUDA_VISIBLE_DEVICES": None,  # no GPU: left alone
        "torch": int(cores),
    }
