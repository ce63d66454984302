"""The memory plan of a GRPO run's configuration (:mod:`llmrl_core.memory_plan`) on this host's devices, as the
local cluster will place it (:func:`runtime.placement_plan.gpu_assignment`): ``llmrl plan`` prints it, and the
flow refuses a plan that does not fit a GPU before any worker starts (on CPU it warns: the host's memory is
shared and the operating system may page)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from llmrl_core.hardware import choose_dtype
from llmrl_core.memory_plan import DTYPE_BYTES, GIB, ModelShape, PlanInputs, PlanLine, memory_plan, over_budget
from llmrl_core.model_store import resolve_model
from llmrl_core.pipeline.grpo_config import GRPOConfig
from runtime.placement_plan import (
    GpuAssignment,
    RunConfig,
    available_cores,
    gpu_assignment,
    local_worker_names,
    rollout_count,
    trainer_names,
    visible_gpus,
    worker_environments,
)


@dataclass
class RunPlan:
    """A run's plan: the model's shape, the inputs, the lines, each device's capacity and what does not fit."""

    shape: ModelShape
    inputs: PlanInputs
    lines: list[PlanLine]
    capacity: dict[str, int]
    problems: list[str]


def device_capacity(gpus: list[str]) -> dict[str, int]:
    """Bytes of the host's memory (``cpu``) and of each visible GPU (``cuda:<id>``)."""
    import psutil
    import torch

    capacity = {"cpu": int(psutil.virtual_memory().total)}
    for index, gpu in enumerate(gpus):
        capacity[f"cuda:{gpu}"] = int(torch.cuda.get_device_properties(index).total_memory)
    return capacity


def plan_run(cfg: GRPOConfig, gpus: list[str] | None = None, capacity: dict[str, int] | None = None) -> RunPlan:
    """The plan of ``cfg`` with ``gpus`` (default: the GPUs this host sees) and their ``capacity`` (bytes per
    device; default: measured)."""
    gpus = visible_gpus() if gpus is None else gpus
    capacity = device_capacity(gpus) if capacity is None else capacity
    shape = ModelShape.from_model_dir(resolve_model(cfg.model))
    visible = gpu_assignment(cfg, gpus).visible

    def device(name: str) -> str:
        ids = visible.get(name, "")
        return f"cuda:{ids.split(',')[0]}" if ids else "cpu"

    engines = tuple(device(n) for n in local_worker_names(cfg) if n.startswith("rollout-"))
    engine_dtype = choose_dtype(cfg.rollout.dtype, "cuda" if any(e.startswith("cuda") for e in engines) else "cpu")
    lora = cfg.train.lora
    inputs = PlanInputs(
        trainer_device=device("trainer"),
        other_trainer_ranks=tuple(device(n) for n in trainer_names(cfg)[1:]),
        engine_devices=engines,
        token_budget=cfg.train.token_budget,
        gradient_checkpointing=cfg.train.gradient_checkpointing,
        trainable_parameters=shape.lora_parameters(lora.r, list(lora.target_modules)) if lora.enabled else None,
        reference_model=cfg.train.kl_coef > 0,
        engine_dtype_bytes=DTYPE_BYTES.get(engine_dtype.dtype, 4),
        max_model_len=cfg.rollout.max_model_len,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization or 0.4,
        cpu_kv_cache_bytes=int(cfg.rollout.kv_cache_gb * GIB),
        device_memory=capacity,
        engine_backend=cfg.rollout.backend,
        max_new_tokens=cfg.rollout.max_new_tokens,
        engine_sleep_level=cfg.rollout.sleep_level,
        ipc_weights_copy=_hands_over_by_cuda_ipc(cfg, visible),
    )
    lines = memory_plan(shape, inputs)
    return RunPlan(shape, inputs, lines, capacity, over_budget(lines, capacity, shape, inputs))


def _hands_over_by_cuda_ipc(cfg: GRPOConfig, visible: dict[str, str]) -> bool:
    """Whether the run's weight route will be CUDA IPC (``rollout.weight_sync=cuda_ipc`` where the planned GPUs
    carry it; ``auto`` never picks it yet): the trainer then holds an fp32 copy of the weights while the engines
    load it."""
    from runtime.weight_sync import local_route

    engines = [n for n in local_worker_names(cfg) if n.startswith("rollout-")]
    try:
        return local_route(cfg.rollout.weight_sync, visible, engines, backend=cfg.rollout.backend).name == "cuda_ipc"
    except ValueError:  # a route that cannot work is refused by the placement check, not here
        return False


def check_run_memory(cfg: GRPOConfig, warn: bool = True) -> RunPlan | None:
    """Refuse (``ValueError``) a plan that does not fit a GPU; warn (``warn``) about one over the host's memory. A
    model whose config.json the plan cannot read (another architecture family) is run without a plan, with a
    warning."""
    try:
        plan = plan_run(cfg)
    except ValueError as err:
        if warn:
            logging.getLogger("llmrl.memory").warning("no memory plan for this model (%s); the run goes on", err)
        return None
    gpu_problems = [p for p in plan.problems if p.startswith("cuda") or "engine" in p.split(":")[0]]
    if gpu_problems and any(d.startswith("cuda") for d in plan.capacity):
        raise ValueError("memory plan (llmrl plan): " + "; ".join(gpu_problems))
    for problem in plan.problems if warn else ():
        logging.getLogger("llmrl.memory").warning("memory plan (llmrl plan): %s", problem)
    return plan


def check_local_placement(
    cfg: RunConfig, rollout_workers: int | None = None, warn: bool = True
) -> tuple[dict[str, dict[str, str]], GpuAssignment]:
    """The local cluster's plan for ``cfg`` (each worker's environment and GPUs), refused with a ``ValueError`` naming
    the setting where it cannot work: GPUs and threads (:func:`gpu_assignment`), and for a GRPO run the weight
    route and the memory plan. ``llmrl run`` calls it before anything starts (a one-line error); the flow again
    before its workers start. ``warn``: log the memory plan's warnings (the flow does; the CLI's early check not)."""
    from runtime.weight_sync import check_local_route

    envs, gpus = worker_environments(cfg, visible_gpus(), available_cores(), rollout_count(cfg, rollout_workers))
    if isinstance(cfg, GRPOConfig):  # a weight route or a memory plan that cannot work: refused before any worker
        check_local_route(
            cfg.rollout.weight_sync,
            gpus.visible,
            [n for n in envs if n.startswith("rollout-")],
            backend=cfg.rollout.backend,
        )
        check_run_memory(cfg, warn=warn)
    return envs, gpus
