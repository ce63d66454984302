"""The TorchRL arguments llmrl's envs and primers refuse by name (specs and Ray services), in one place."""

from __future__ import annotations

from typing import Any


def refuse_torchrl_only(owner: str, *, primers: Any = None, use_ray_service: bool = False, **ray: Any) -> None:
    """Refuse, by name, the TorchRL arguments that have no meaning here: ``primers`` (TorchRL specs: llmrl's envs
    take their extra fields from the prompt rows) and Ray services (llmrl hosts remote parts on Dask)."""
    if primers is not None:
        raise ValueError(
            f"{owner}: primers= takes TorchRL specs, which llmrl does not use; extra prompt fields come from the "
            "dataset rows themselves (pass them as row fields)"
        )
    if use_ray_service or any(bool(v) for v in ray.values()):
        names = ["use_ray_service"] if use_ray_service else [k for k, v in ray.items() if v]
        raise ValueError(
            f"{owner}: {', '.join(names)} asks for a Ray service; llmrl runs remote parts on Dask "
            "(see RayLLMCollector / RayRetrieveKL, hosted as Dask actors)"
        )
