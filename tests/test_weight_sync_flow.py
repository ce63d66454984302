"""``rollout.weight_sync``: when the GRPO flow broadcasts new weights (NCCL, gloo) instead of loading checkpoints,
and the order of the actor calls that forms the group and sends a version (fake actors for that order; the same
path for real with gloo between a CPU trainer and real vLLM CPU engines on other Dask workers, end to end)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.weight_sync import vLLMUpdater
from runtime.weight_sync import (
    BroadcastWeightSync,
    CheckpointLoads,
    CudaIpcWeightSync,
    Endpoint,
    EngineActorsUpdater,
    WeightRoute,
    check_local_route,
    choose_weight_route,
    endpoint_of,
    updater_for,
)
from tasks import grpo_stages as stages

METADATA = [("model.embed_tokens.weight", "float32", (8, 4)), ("lm_head.weight", "float32", (8, 4))]


@dataclass
class Done:
    """What a Dask actor call returns: a future whose result is ready."""

    value: Any = None
    awaited: Any = None  # called when the result is taken (records when a caller waited for it)

    def result(self, timeout: float | None = None) -> Any:
        if self.awaited is not None:
            self.awaited()
        return self.value


class FakeEngine:
    def __init__(self, name: str, ranks: int, log: list, answer: int | None = None) -> None:
        self.name, self.ranks, self.log, self.answer = name, ranks, log, answer

    def weight_group_size(self) -> Done:
        return Done(self.ranks)

    def join_weight_group(self, host: str, port: int, offset: int, world: int) -> Done:
        self.log.append((self.name, "join", host, port, offset, world))
        return Done()

    def receive_weights(self, metadata: list, version: int) -> Done:
        self.log.append((self.name, "receive", metadata, version))
        return Done(version if self.answer is None else self.answer)

    def load(self, path: str, version: int) -> Done:
        self.log.append((self.name, "load", path, version))
        answer = version if self.answer is None else self.answer
        return Done(answer, lambda: self.log.append((self.name, "loaded", version)))

    def weights_fingerprint(self) -> Done:
        return Done({"fingerprint": self.held, "dtype": "float32"})

    held = "00000000000000f1"  # the fingerprint of what the engine loaded (the trainer's unless a test says not)


class FakeTrainer:
    def __init__(self, log: list) -> None:
        self.log = log

    def weight_group_port(self) -> Done:
        return Done(29555)

    def open_weight_group(self, host: str, port: int, world: int) -> Done:
        self.log.append(("trainer", "open", host, port, world))
        return Done()

    def weights_metadata(self) -> Done:
        return Done(METADATA)

    def broadcast_weights(self, metadata: list) -> Done:
        self.log.append(("trainer", "broadcast", metadata))
        return Done(len(metadata))

    def stage(self, version: int, config: dict) -> Done:
        self.log.append(("trainer", "stage", version))
        return Done({"version": version, "checkpoint": f"/ckpt/policy_v{version:06d}.safetensors", "seconds": 0.5})

    def seal(self, version: int, config: dict, fingerprint_dtypes: list | tuple = ()) -> Done:
        self.log.append(("trainer", "seal", version))
        self.sealed_dtypes = list(fingerprint_dtypes)
        return Done(
            {
                "version": version,
                "checkpoint": f"/ckpt/policy_v{version:06d}.safetensors",
                "sha256": "x",
                "fingerprints": {dtype: "00000000000000f1" for dtype in fingerprint_dtypes},
                "seconds": 2,
            }
        )


def _cfg(*overrides: str) -> GRPOConfig:
    return load_config(GRPOConfig, None, list(overrides))


def test_the_setting_is_checked_and_is_not_part_of_what_a_version_is():
    rule = r"rollout.weight_sync: must be one of \['auto', 'checkpoint', 'nccl', 'gloo', 'cuda_ipc'\], got 'broadcast'"
    with pytest.raises(ValueError, match=rule):
        _cfg("rollout.weight_sync=broadcast")
    assert _cfg().rollout.weight_sync == "auto"
    assert stages.lineage_config(_cfg("rollout.weight_sync=checkpoint")) == stages.lineage_config(_cfg())


def _at(host: str, *gpus: str) -> Endpoint:
    return Endpoint(host, "cuda" if gpus else "cpu", gpus)


@pytest.mark.parametrize(
    ("topology", "trainer", "engines", "auto", "nccl", "ipc"),
    [
        ("1 GPU: engine and trainer share it", _at("h", "G0"), [_at("h", "G0")], "checkpoint", "refused", "ok"),
        ("2 engines on the trainer's GPU", _at("h", "G0"), [_at("h", "G0"), _at("h", "G0")], "checkpoint", "refused",
         "ok"),
        ("2 GPUs, one host", _at("h", "G0"), [_at("h", "G1")], "nccl", "nccl", "refused"),
        ("2 hosts", _at("a", "G0"), [_at("b", "G7")], "nccl", "nccl", "refused"),
        ("2 hosts, same local GPU index", _at("a", "0"), [_at("b", "0")], "nccl", "nccl", "refused"),
        ("CPU", _at("h"), [_at("h")], "checkpoint", "refused", "refused"),
        ("mixed: a CPU engine", _at("h", "G0"), [_at("h", "G1"), _at("h")], "checkpoint", "refused", "refused"),
        ("mixed: one engine beside the trainer, one apart", _at("h", "G0"), [_at("h", "G0"), _at("h", "G1")],
         "checkpoint", "refused", "refused"),
        ("tensor-parallel engine overlapping the trainer", _at("h", "G1"), [_at("h", "G0", "G1")], "checkpoint",
         "refused", "refused"),
    ],
)  # fmt: skip
def test_the_weight_route_follows_the_topology(topology, trainer, engines, auto, nccl, ipc):
    if ipc == "ok":  # CUDA IPC: opt-in, for engines on the trainer's GPU only
        assert choose_weight_route("cuda_ipc", trainer, engines).name == "cuda_ipc"
    else:
        with pytest.raises(ValueError, match=r"rollout.weight_sync=cuda_ipc (needs|hands)"):
            choose_weight_route("cuda_ipc", trainer, engines)
    route = choose_weight_route("auto", trainer, engines)
    assert route.name == auto and route.reason, topology
    assert choose_weight_route("checkpoint", trainer, engines).name == "checkpoint"
    if nccl == "refused":
        with pytest.raises(ValueError, match=r"rollout.weight_sync=nccl"):
            choose_weight_route("nccl", trainer, engines)
    else:
        assert choose_weight_route("nccl", trainer, engines).name == "nccl"
    if topology == "CPU":
        assert choose_weight_route("gloo", trainer, engines).name == "gloo"
    else:
        with pytest.raises(ValueError, match=r"rollout.weight_sync=gloo carries weights between CPU workers only"):
            choose_weight_route("gloo", trainer, engines)


def test_nccl_on_one_gpu_is_refused_before_any_worker_starts():
    """The local cluster's GPU plan (runtime.placement_plan.gpu_assignment) puts the trainer and the engine on the one
    GPU: weight_sync=nccl is refused with the reason; auto is fine (it will take the shared file)."""
    from runtime.placement_plan import gpu_assignment

    cfg = _cfg("rollout.weight_sync=nccl", "train.device=cuda")
    visible = gpu_assignment(cfg, ["0"]).visible
    with pytest.raises(ValueError, match=r"shares GPU 0 with the trainer.*NCCL refuses two ranks on one device"):
        check_local_route("nccl", visible, ["rollout-0"])
    check_local_route("auto", visible, ["rollout-0"])
    two = gpu_assignment(cfg, ["0", "1"]).visible
    assert two["trainer"] != two["rollout-0"]
    check_local_route("nccl", two, ["rollout-0"])
    check_local_route("cuda_ipc", visible, ["rollout-0"])  # the one GPU: the route CUDA IPC is for
    with pytest.raises(ValueError, match=r"cuda_ipc hands the weights over on the trainer's GPU, and engine 0 runs on"):
        check_local_route("cuda_ipc", two, ["rollout-0"])


def test_the_route_opens_a_group_only_for_nccl():
    log: list = []
    engines, trainer = [FakeEngine("e0", 1, log)], FakeTrainer(log)
    loads = updater_for(WeightRoute("checkpoint", "x"), trainer, engines, "tcp://127.0.0.1:1")
    assert isinstance(loads.scheme, CheckpointLoads) and loads.mode == "checkpoint"
    assert log == []  # no group was formed
    updater = updater_for(WeightRoute("nccl", "x"), trainer, engines, "tcp://127.0.0.1:1")
    assert isinstance(updater, vLLMUpdater) and updater.mode == "nccl"
    assert isinstance(updater.scheme, BroadcastWeightSync) and updater.scheme.world_size == 2
    described = {"trainer_device": "cuda:0", "host": "h", "gpus": "G0"}
    assert endpoint_of(described, "trainer") == Endpoint("h", "cuda", ("G0",))


def test_the_group_gives_each_engine_its_ranks_and_the_trainer_rank_0():
    """Engines with 1 and 2 GPUs (tensor parallel): ranks 1 and 2-3 of 4; every engine is asked to join before
    the trainer's blocking rendezvous, at the trainer worker's host."""
    log: list = []
    engines = [FakeEngine("e0", 1, log), FakeEngine("e1", 2, log)]
    sync = BroadcastWeightSync(FakeTrainer(log), engines, "tcp://10.1.2.3:40001").open()
    assert sync.world_size == 4
    assert log == [
        ("e0", "join", "10.1.2.3", 29555, 1, 4),
        ("e1", "join", "10.1.2.3", 29555, 2, 4),
        ("trainer", "open", "10.1.2.3", 29555, 4),
    ]


def test_a_push_sends_the_trainers_tensor_list_to_every_engine_then_broadcasts():
    log: list = []
    engines = [FakeEngine("e0", 1, log), FakeEngine("e1", 1, log)]
    sync = BroadcastWeightSync(FakeTrainer(log), engines, "tcp://127.0.0.1:1").open()
    log.clear()
    assert sync.push(3) == [3, 3]
    assert log == [
        ("e0", "receive", METADATA, 3),
        ("e1", "receive", METADATA, 3),
        ("trainer", "broadcast", METADATA),
    ]
    wrong = BroadcastWeightSync(FakeTrainer(log), [FakeEngine("e0", 1, log, answer=2)], "tcp://127.0.0.1:1").open()
    with pytest.raises(RuntimeError, match=r"engines report versions \[2\] after the NCCL broadcast of version 3"):
        wrong.push(3)


def test_publishing_broadcasts_instead_of_loading_the_checkpoint():
    log: list = []
    engines, trainer = [FakeEngine("e0", 1, log)], FakeTrainer(log)
    sync = EngineActorsUpdater(engines, BroadcastWeightSync(trainer, engines, "tcp://127.0.0.1:1").open())
    log.clear()
    staged = stages.publish_weights.fn(trainer, engines, 2, {}, sync)
    # the weights file is written, then broadcast; the seal (hash, manifest, state) needs the trainer: it comes after
    assert log == [
        ("trainer", "stage", 2),
        ("e0", "receive", METADATA, 2),
        ("trainer", "broadcast", METADATA),
        ("trainer", "seal", 2),
    ]
    assert stages.seal_checkpoint.fn(staged)["sha256"] == "x"
    log.clear()
    staged = stages.publish_weights.fn(trainer, engines, 2, {})  # no group: every engine loads the checkpoint
    assert log == [  # the seal is asked for once the engines hold the version: beside their rollout, not the loads
        ("trainer", "stage", 2),
        ("e0", "load", "/ckpt/policy_v000002.safetensors", 2),
        ("e0", "loaded", 2),
        ("trainer", "seal", 2),
    ]
    assert staged.version == 2 and staged.checkpoint == "/ckpt/policy_v000002.safetensors"
    assert staged.seconds["publish_write_s"] == 0.5 and 0 <= staged.seconds["publish_load_s"] < 1
    # the engines' fingerprints are kept, the seal computes the trainer's in their dtype, the commit compares them
    assert staged.held == [{"fingerprint": "00000000000000f1", "dtype": "float32"}]
    assert trainer.sealed_dtypes == ["float32"]
    assert stages.seal_checkpoint.fn(staged)["fingerprints"] == {"float32": "00000000000000f1"}
    engines[0].held = "00000000000000aa"  # an engine that holds other weights: the commit stops
    stale = stages.publish_weights.fn(trainer, engines, 2, {})
    from llmrl_core.weight_sync.fingerprint import WeightsMismatchError

    with pytest.raises(WeightsMismatchError, match="version 2: .* but engine 0 holds 00000000000000aa"):
        stages.seal_checkpoint.fn(stale)
    staged.version = 3
    with pytest.raises(RuntimeError, match="the trainer sealed version 2 while publishing 3"):
        stages.seal_checkpoint.fn(staged)


def test_every_publish_goes_through_vllmupdater():
    """The one sender: publishing by checkpoint loads or by a broadcast calls TorchRL's ``vLLMUpdater.push_weights``
    (a patched class sees each call, at the version it carries); an engine that reports another version stops it."""
    from unittest import mock

    log: list = []
    engines, trainer = [FakeEngine("e0", 1, log), FakeEngine("e1", 1, log)], FakeTrainer(log)
    original = vLLMUpdater.push_weights
    with mock.patch.object(vLLMUpdater, "push_weights", autospec=True, side_effect=original) as called:
        stages.publish_weights.fn(trainer, engines, 2, {})
        broadcast = EngineActorsUpdater(engines, BroadcastWeightSync(trainer, engines, "tcp://127.0.0.1:1").open())
        stages.publish_weights.fn(trainer, engines, 3, {}, broadcast)
    calls = [(type(c.args[0].scheme).__name__, c.args[1]) for c in called.call_args_list]
    assert calls == [
        ("CheckpointLoads", "/ckpt/policy_v000002.safetensors"),
        ("BroadcastWeightSync", "/ckpt/policy_v000003.safetensors"),
    ]
    assert broadcast.version == 3 and broadcast.loaded == [3, 3]
    assert ("e1", "load", "/ckpt/policy_v000002.safetensors", 2) in log and ("e1", "receive", METADATA, 3) in log
    with pytest.raises(RuntimeError, match=r"engines report versions \[2\] after loading the checkpoint of version 5"):
        EngineActorsUpdater([FakeEngine("e0", 1, log, answer=2)]).push_version(5, "/ckpt/v5")


class IpcEngine(FakeEngine):
    def load_shared_cuda(self, handles: dict, version: int) -> Done:
        self.log.append((self.name, "open", sorted(handles), version))
        return Done(version if self.answer is None else self.answer)


class IpcTrainer(FakeTrainer):
    def share_weights_cuda(self) -> Done:
        self.log.append(("trainer", "share"))
        return Done({name: ("handle", name) for name, _, _ in METADATA})

    def release_shared_cuda(self) -> Done:
        self.log.append(("trainer", "release"))
        return Done()


def test_cuda_ipc_hands_each_version_to_every_engine_then_lets_the_copy_go():
    log: list = []
    engines, trainer = [IpcEngine("e0", 1, log), IpcEngine("e1", 1, log)], IpcTrainer(log)
    sync = updater_for(WeightRoute("cuda_ipc", "x"), trainer, engines, "tcp://127.0.0.1:1")
    assert isinstance(sync.scheme, CudaIpcWeightSync) and log == []  # nothing to open
    assert sync.description == "CUDA IPC (2 engine(s) on the trainer's GPU)"
    staged = stages.publish_weights.fn(trainer, engines, 4, {}, sync)
    names = sorted(name for name, _, _ in METADATA)
    assert log == [  # the checkpoint is still staged (resume, lineage); the engines open the trainer's copy
        ("trainer", "stage", 4),
        ("trainer", "share"),
        ("e0", "open", names, 4),
        ("e1", "open", names, 4),
        ("trainer", "release"),
        ("trainer", "seal", 4),
    ]
    assert stages.seal_checkpoint.fn(staged)["version"] == 4
    log.clear()
    wrong = CudaIpcWeightSync(trainer, [IpcEngine("e0", 1, log, answer=3)])
    with pytest.raises(RuntimeError, match=r"engines report versions \[3\] after the CUDA IPC hand-over of version 4"):
        wrong.push(4)
    assert log[-1] == ("trainer", "release")  # the copy is let go whatever the engines said


def test_an_engine_opens_the_handles_on_its_own_device():
    from runtime.rollout_actor import CUDA_DEVICE_ARGUMENT, open_cuda_handles

    def rebuild_cuda_tensor(*arguments):  # stands in for torch's: records the arguments it is given
        return arguments

    def rebuild_other(*arguments):
        return arguments

    arguments = tuple(range(10))  # the trainer's device index (6) is its own numbering of the GPU
    opened = open_cuda_handles({"w": (rebuild_cuda_tensor, arguments), "b": (rebuild_other, arguments)})
    assert opened["w"][CUDA_DEVICE_ARGUMENT] == 0 and opened["w"][:6] == arguments[:6] == opened["b"][:6]
    assert opened["b"] == arguments  # only CUDA tensors name a device


def test_a_cpu_trainer_refuses_to_share_by_cuda_ipc():
    import torch

    from runtime.trainer_actor import TrainerWorker

    trainer = TrainerWorker.__new__(TrainerWorker)
    trainer._weights_to_send = lambda: {"model.embed_tokens.weight": torch.zeros(2)}
    with pytest.raises(RuntimeError, match=r"cuda_ipc needs the trainer's weights on CUDA; model.embed_tokens.weight"):
        trainer.share_weights_cuda()


def test_a_trainer_protects_the_checkpoints_a_resume_needs_until_its_version_is_committed():
    """Sealing v keeps v - 1 (the last commit) and, in an asynchronous run, the max_staleness versions before it
    (they re-sample the unpublished batches)."""
    from runtime.trainer_actor import TrainerWorker

    trainer = TrainerWorker.__new__(TrainerWorker)  # only the config matters here
    trainer.cfg = _cfg()
    assert list(trainer._resume_needs(5)) == [4] and list(trainer._resume_needs(0)) == []
    trainer.cfg = _cfg("rollout.max_staleness=2")
    assert list(trainer._resume_needs(5)) == [2, 3, 4] and list(trainer._resume_needs(1)) == [0]


@pytest.mark.slow
def test_a_gloo_broadcast_carries_each_version_to_real_cpu_engines(tmp_path, default_model_path):
    """rollout.weight_sync=gloo on CPU: 2 iterations with two vLLM CPU engines on their own Dask workers receiving each
    version from the trainer actor's broadcast (no weights file read by the engines). The flow checks each engine's
    weights fingerprint against the trainer's before it trains on its rows; here the rows of version 1, sampled by
    the engines after the broadcast, have the trainer's log-probs (fp32 on both sides)."""
    import json

    from flows.grpo import grpo
    from storage.trajectories import TrajectoryStore

    runs = tmp_path / "runs"
    summary = grpo(
        overrides=[
            "run_id=gloo",
            f"runs_dir={runs}",
            "iterations=2",
            "data.prompts_per_iteration=2",
            "data.group_size=2",
            "rollout.workers=2",
            "rollout.weight_sync=gloo",
            "rollout.max_new_tokens=16",
            "rollout.dtype=float32",
            "rollout.kv_cache_gb=0.25",
            "train.mixed_precision=no",
            "rollout.temperature=1.0",
            "train.lr=1e-4",
            "progress=false",
        ]
    )
    assert summary["published_version"] == 2
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    tags = [r.data.tags for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert any(t.get("llmrl.weight_route", "").startswith("gloo (") for t in tags), tags
    for version in (0, 1):
        records = TrajectoryStore(runs / "trajectories").read_records("gloo", version=version)
        assert len(records) == 4 and {r.policy_version for r in records} == {version}
        metrics = json.loads((runs / "gloo" / "state" / f"published-v{version + 1}.json").read_text())["metrics"]
        assert metrics["agreement_abs_diff_mean"] < 1e-3, metrics  # sampler (after the broadcast) == trainer
