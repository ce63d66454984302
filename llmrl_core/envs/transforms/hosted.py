"""``HostedTransform``: a transform whose work runs in a Dask actor (:mod:`llmrl_core.dask_hosting`), the base of
llmrl's Ray-named transforms (TorchRL hosts them in Ray actors): ``RayKLRewardTransform`` / ``RayRetrieveKL``
(:mod:`llmrl_core.envs.transforms.kl_hosted`) and ``RayMCAdvantage`` (:mod:`llmrl_core.objectives.advantage_hosted`).

Calling the local object runs the transform in the actor, as TorchRL's ``RayTransform`` does: ``transform(td)``
(``forward``), and in an env ``_step(td, next_td)``, ``_reset``, ``_call``, ``inv``. TensorDicts go to the actor
on the CPU, and results come back on the CPU (or on the device given to ``.to(device)`` here); ``device=`` is the
device the transform uses in the actor. ``close()`` (or ``shutdown()``, or a ``with`` block) releases the actor.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from tensordict import is_tensor_collection

from llmrl_core.envs.transforms.td_base import Transform

__all__ = ["HostedTransform"]


def _to_actor(value: Any) -> Any:
    """What is sent to the actor: TensorDicts and tensors on the CPU, without a device (TorchRL's mapping)."""
    if isinstance(value, tuple | list):
        return type(value)(_to_actor(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_actor(v) for k, v in value.items()}
    if is_tensor_collection(value):
        if value.device is None:
            return value  # pickled as it is: the caller's object is not touched
        return value.clone().cpu().clear_device_()
    if isinstance(value, torch.Tensor) and value.device.type != "cpu":
        return value.cpu()
    return value


def _from_actor(value: Any, device: torch.device | None) -> Any:
    """A result from the actor (a fresh copy): moved to ``device`` when set, else left on the CPU, device-less."""
    if isinstance(value, tuple | list):
        return type(value)(_from_actor(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _from_actor(v, device) for k, v in value.items()}
    if device is not None and (is_tensor_collection(value) or isinstance(value, torch.Tensor)):
        return value.to(device)
    if is_tensor_collection(value) and value.device is not None:
        return value.clear_device_()
    return value


class HostedTransform(Transform):
    """A transform whose work runs in a Dask actor; subclasses name the hosted class in ``_hosted``."""

    _hosted: ClassVar[str | type]  # the class, or "package.module:Class" (imported on the worker)

    def __init__(
        self,
        transform_kwargs: dict[str, Any],
        *,
        num_cpus: int | None,
        num_gpus: float | None,
        device: Any,
        actor_name: str | None,
        client: Any,
        address: str | None,
    ) -> None:
        from llmrl_core.dask_hosting import RAY_ONLY_ARGUMENTS, DaskHost, refuse_ray_only

        name = type(self).__name__
        refuse_ray_only(name, **{k: transform_kwargs.pop(k) for k in RAY_ONLY_ARGUMENTS if k in transform_kwargs})
        transform_kwargs.pop("use_ray_service", None)  # this already is the hosted variant
        super().__init__()
        if device is not None:
            transform_kwargs["device"] = device
        self.__dict__["_local_device"] = None  # set by .to(device): where results are moved
        self.__dict__["_remote_device"] = device
        self.__dict__["_host"] = DaskHost(
            self._hosted,
            kwargs=transform_kwargs,
            client=client,
            address=address,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            actor_name=actor_name,
            device=device,
            name=name,
        )

    # --- the remote calls ------------------------------------------------------------------------
    def _remote(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = self._host.call(method, *_to_actor(args), **_to_actor(kwargs))
        return _from_actor(result, self.__dict__["_local_device"])

    def forward(self, tensordict: Any) -> Any:
        return self._remote("forward", tensordict)

    def _call(self, next_tensordict: Any) -> Any:
        return self._remote("_call", next_tensordict)

    def _step(self, tensordict: Any, next_tensordict: Any) -> Any:
        return self._remote("_step", tensordict, next_tensordict)

    def _reset(self, tensordict: Any, tensordict_reset: Any) -> Any:
        return self._remote("_reset", tensordict, tensordict_reset)

    def _inv_call(self, tensordict: Any) -> Any:
        return self._remote("_inv_call", tensordict)

    def inv(self, tensordict: Any) -> Any:
        return self._remote("inv", tensordict)

    def init(self, tensordict: Any) -> None:
        self._remote("init", tensordict)

    def transform_reward_spec(self, reward_spec: Any) -> Any:
        return self._remote("transform_reward_spec", reward_spec)

    def transform_observation_spec(self, observation_spec: Any) -> Any:
        return self._remote("transform_observation_spec", observation_spec)

    def transform_output_spec(self, output_spec: Any) -> Any:
        return self._remote("transform_output_spec", output_spec)

    def transform_input_spec(self, input_spec: Any) -> Any:
        return self._remote("transform_input_spec", input_spec)

    def empty_cache(self) -> None:
        super().empty_cache()
        self._host.call("empty_cache")

    # --- the remote transform's state ------------------------------------------------------------
    @property
    def in_keys(self) -> list:
        return self._host.get("in_keys")

    @in_keys.setter
    def in_keys(self, value: Any) -> None:
        self._host.set("in_keys", value)

    @property
    def out_keys(self) -> list:
        return self._host.get("out_keys")

    @out_keys.setter
    def out_keys(self, value: Any) -> None:
        self._host.set("out_keys", value)

    def set_missing_tolerance(self, mode: bool = False) -> None:
        if "_host" in self.__dict__:
            self._host.call("set_missing_tolerance", mode)

    @property
    def missing_tolerance(self) -> bool:
        return bool(self._host.get("missing_tolerance"))

    @property
    def device(self) -> torch.device | None:
        """The device results are moved to here (set with ``.to(device)``; None: the CPU)."""
        return self.__dict__["_local_device"]

    def to(self, *args: Any, **kwargs: Any) -> HostedTransform:
        """Record where results go (the remote transform keeps its own ``device``)."""
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None:
            self.__dict__["_local_device"] = device
        return super().to(*args, **kwargs)

    # --- life --------------------------------------------------------------------------------------
    def where(self) -> dict[str, Any]:
        """``{"worker": address, "pid": process id}`` of the actor."""
        return self._host.where()

    def close(self) -> None:
        """Close the remote transform and release the actor (and a cluster this transform started)."""
        host = self.__dict__.get("_host")
        if host is None or host.closed:
            return
        try:
            if host.has("close"):
                host.call("close")
        finally:
            host.close()

    shutdown = close

    def __enter__(self) -> HostedTransform:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        host = self.__dict__.get("_host")
        if host is None or host.closed:
            return f"{type(self).__name__}(actor=None)"
        try:
            return host.call("__repr__")
        except Exception:
            return f"{type(self).__name__}(actor={host!r})"
