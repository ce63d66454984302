"""``RayDataLoadingPrimer``: TorchRL's actor-hosted ``DataLoadingPrimer``, hosted in a Dask actor.

One :class:`~llmrl_core.envs.primer.DataLoadingPrimer` lives in a Dask actor (:mod:`llmrl_core.dask_hosting`: the
``client=``/``address=`` cluster, the current ``distributed`` client's, or a one-worker local cluster owned by this
object), and every env that appends a ``RayDataLoadingPrimer`` naming the same actor draws its prompts from that one
cursor: no prompt is served twice while the epoch lasts, whichever env asks. ``actor_name`` is the actor's Dask key:
a second ``RayDataLoadingPrimer`` with the same name on the same scheduler (in another process too) shares the live
actor; without a name each object hosts a primer of its own.

Arguments are TorchRL's: exactly one of ``dataloader`` / ``dataloader_factory`` (``ValueError`` otherwise),
``num_cpus`` (default: the dataloader's ``num_workers``, at least 1; see :mod:`llmrl_core.dask_hosting` for what it
means on Dask), ``num_gpus``, ``device``, ``actor_name``, and the rest passed to the hosted ``DataLoadingPrimer``
(``batch_size``, ``repeats``, ``group_repeats``, ...). ``DataLoadingPrimer(..., use_ray_service=True)`` builds one.
``close()`` (or ``shutdown()``, or a ``with`` block) releases the actor.
"""

from __future__ import annotations

from typing import Any

from llmrl_core.envs.torchrl_only import refuse_torchrl_only
from llmrl_core.envs.transforms.td_base import Transform
from llmrl_core.envs.types import PromptRow

__all__ = ["RayDataLoadingPrimer"]

_HOSTED = "llmrl_core.envs.primer:DataLoadingPrimer"


def _workers_of(dataloader: Any) -> int:
    """TorchRL's default ``num_cpus``: the dataloader's ``num_workers`` (1 when it has none or 0)."""
    return max(1, int(getattr(dataloader, "num_workers", 1) or 1))


class RayDataLoadingPrimer(Transform):
    """A ``DataLoadingPrimer`` in a Dask actor, shared by every env that names the same actor (module docstring)."""

    env_checkpoint = True

    def __init__(
        self,
        *,
        dataloader: Any = None,
        dataloader_factory: Any = None,
        num_cpus: int | None = None,
        num_gpus: float | None = 0,
        device: Any = None,
        actor_name: str | None = None,
        client: Any = None,
        address: str | None = None,
        **kwargs: Any,
    ) -> None:
        from llmrl_core.dask_hosting import RAY_ONLY_ARGUMENTS, DaskHost, refuse_ray_only

        if dataloader is not None and dataloader_factory is not None:
            raise ValueError("Cannot provide both 'dataloader' and 'dataloader_factory'. Choose one.")
        if dataloader is None and dataloader_factory is None:
            raise ValueError("Must provide exactly one of 'dataloader' or 'dataloader_factory'.")
        refuse_torchrl_only(type(self).__name__, primers=kwargs.pop("primers", None))
        refuse_ray_only(type(self).__name__, **{k: kwargs.pop(k) for k in RAY_ONLY_ARGUMENTS if k in kwargs})
        kwargs.pop("use_ray_service", None)  # this already is the hosted variant
        if num_cpus is None:
            num_cpus = _workers_of(dataloader if dataloader is not None else dataloader_factory())
        super().__init__()
        source = {"dataloader": dataloader} if dataloader is not None else {"dataloader_factory": dataloader_factory}
        self.device = device
        self._host = DaskHost(
            _HOSTED,
            kwargs={**source, **kwargs, "device": device},
            client=client,
            address=address,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            actor_name=actor_name,
            name=type(self).__name__,
        )

    # --- what the env calls ----------------------------------------------------------------------
    def provide_prompts(self, batch_size: int | None) -> list[PromptRow]:
        """The next batch, drawn from the shared cursor in the actor."""
        return self._host.call("provide_prompts", batch_size)

    def reset_dataloader(self, seed: int | None = None) -> RayDataLoadingPrimer:
        """Restart the shared cursor from the first prompt (optionally with a new seed); returns this object."""
        self._host.call("reset_dataloader", seed)
        return self

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """The shared cursor (what a checkpoint of an env holding this primer keeps)."""
        return self._host.call("state_dict")

    def load_state_dict(self, state: dict[str, Any], *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Set the shared cursor (every env sharing the actor continues from it)."""
        self._host.call("load_state_dict", state)

    # --- the hosted primer's settings ------------------------------------------------------------
    @property
    def num_cpus(self) -> int | None:
        """The ``num_cpus`` the actor was hosted with."""
        return self._host.num_cpus

    @property
    def batch_size(self) -> int:
        return self._host.get("batch_size")

    @property
    def repeats(self) -> int:
        return self._host.get("repeats")

    @property
    def group_repeats(self) -> bool:
        return self._host.get("group_repeats")

    @property
    def epoch(self) -> int:
        return self._host.get("epoch")

    @property
    def dataloader(self) -> Any:
        raise NotImplementedError("dataloader is not implemented for RayDataLoadingPrimer")

    @property
    def endless_dataloader(self) -> Any:
        raise NotImplementedError("endless_dataloader is not implemented for RayDataLoadingPrimer")

    @property
    def stack_method(self) -> Any:
        raise NotImplementedError("stack_method is not implemented for RayDataLoadingPrimer")

    # --- the actor's lifetime --------------------------------------------------------------------
    def close(self) -> None:
        """Release the actor (and the cluster this object started, if it did)."""
        self._host.close()

    shutdown = close

    def __enter__(self) -> RayDataLoadingPrimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._host.closed:
            return "RayDataLoadingPrimer(actor=None)"
        return f"Ray{self._host.call('__repr__')}"
