"""``RayKLRewardTransform`` and ``RayRetrieveKL``: TorchRL's Ray-hosted KL transforms, hosted in a Dask actor.

Each builds its transform (:class:`~llmrl_core.envs.transforms.kl.KLRewardTransform` /
:class:`~llmrl_core.envs.transforms.kl.RetrieveKL`) inside a Dask actor (:mod:`llmrl_core.dask_hosting`: the
current ``distributed`` client's cluster, or a one-worker local cluster owned by the transform), so several envs
can share one reference model kept on one worker. Model factories (``ref_model_factory=``, ``gen_model_factory=``)
are called on the worker: the model never travels; a model passed directly travels pickled.

Calling the local object runs the transform in the actor, as TorchRL's ``RayTransform`` does: ``transform(td)``
(``forward``), and in an env ``_step(td, next_td)``, ``_reset``, ``_call``, ``inv``. TensorDicts go to the actor
on the CPU, and results come back on the CPU (or on the device given to ``.to(device)`` here); ``device=`` is the
device the transform uses in the actor (checked there: a CUDA device on a worker without CUDA is a clear
``RuntimeError``). The container (env) is kept here; ``in_keys``/``out_keys`` are the remote transform's.

Ray arguments: ``num_gpus`` > 0 asks for a Dask worker declaring the ``GPU`` resource, ``num_cpus`` (default 1,
as TorchRL) is recorded, ``actor_name`` is the actor's Dask key (a live actor of that name is reused); Ray-only
settings passed through ``**kwargs`` (``runtime_env``, ...) are refused. ``client=`` / ``address=`` choose the
cluster; :meth:`shutdown` (or ``close()``, or a ``with`` block) releases the actor.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from tensordict import is_tensor_collection

from llmrl_core.envs.transforms.td_base import Transform

__all__ = ["RayKLRewardTransform", "RayRetrieveKL"]


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


class _HostedTransform(Transform):
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

    def to(self, *args: Any, **kwargs: Any) -> _HostedTransform:
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
            host.call("close")
        finally:
            host.close()

    shutdown = close

    def __enter__(self) -> _HostedTransform:
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


class RayKLRewardTransform(_HostedTransform):
    """TorchRL's ``RayKLRewardTransform``: a :class:`~llmrl_core.envs.transforms.kl.KLRewardTransform` in a Dask
    actor (see the module docstring).

    Args:
        ref_model: the reference model (pickled to the worker); prefer ``ref_model_factory``.

    Keyword Args:
        ref_model_factory: builds the reference model on the worker.
        num_cpus: recorded (default 1); on an owned cluster, the worker's torch threads.
        num_gpus: > 0 places the actor on a Dask worker declaring the ``GPU`` resource (default 0).
        device: the device of the transform in the actor.
        actor_name: the actor's Dask key; a live actor of that name is reused.
        client / address: the Dask cluster (default: the current client, else an owned local cluster).
        **kwargs: passed to ``KLRewardTransform`` (``coef``, ``in_keys``, ``log_prob_key``, ...).
    """

    _hosted = "llmrl_core.envs.transforms.kl:KLRewardTransform"

    def __init__(
        self,
        ref_model: Any = None,
        *,
        ref_model_factory: Any = None,
        num_cpus: int | None = None,
        num_gpus: int = 0,
        device: Any = None,
        actor_name: str | None = None,
        client: Any = None,
        address: str | None = None,
        **kwargs: Any,
    ) -> None:
        if ref_model is not None and ref_model_factory is not None:
            raise ValueError("Cannot provide both 'ref_model' and 'ref_model_factory'. Choose one.")
        if ref_model is None and ref_model_factory is None:
            raise ValueError("Must provide exactly one of 'ref_model' or 'ref_model_factory'.")
        if ref_model_factory is not None:
            kwargs["ref_model_factory"] = ref_model_factory
        super().__init__(
            {"ref_model": ref_model, **kwargs},
            num_cpus=1 if num_cpus is None else num_cpus,
            num_gpus=num_gpus,
            device=device,
            actor_name=actor_name,
            client=client,
            address=address,
        )


class RayRetrieveKL(_HostedTransform):
    """TorchRL's ``RayRetrieveKL``: a :class:`~llmrl_core.envs.transforms.kl.RetrieveKL` in a Dask actor (see the
    module docstring).

    Args:
        gen_model: the generating model as a scoring wrapper, or ``"from_collector"`` (default; the hosted transform
            has no collector to take it from, as in TorchRL: pass a model or ``gen_model_factory``). To use
            ``gen_model_factory``, pass ``gen_model=None``.
        ref_model: the reference model (pickled to the worker); prefer ``ref_model_factory``.

    Keyword Args:
        gen_model_factory / ref_model_factory: build the models on the worker.
        num_cpus: recorded (default 1); on an owned cluster, the worker's torch threads.
        num_gpus: > 0 places the actor on a Dask worker declaring the ``GPU`` resource (default 0).
        device: the device of the transform in the actor.
        actor_name: the actor's Dask key; a live actor of that name is reused.
        client / address: the Dask cluster (default: the current client, else an owned local cluster).
        **kwargs: passed to ``RetrieveKL`` (``assistant_only``, ``coeff``, ``kl_key``, ...).
    """

    _hosted = "llmrl_core.envs.transforms.kl:RetrieveKL"

    def __init__(
        self,
        gen_model: Any | Literal["from_collector"] | None = "from_collector",
        ref_model: Any = None,
        *,
        gen_model_factory: Any = None,
        ref_model_factory: Any = None,
        num_cpus: int | None = None,
        num_gpus: int = 0,
        device: Any = None,
        actor_name: str | None = None,
        client: Any = None,
        address: str | None = None,
        **kwargs: Any,
    ) -> None:
        if gen_model is not None and gen_model_factory is not None:
            raise ValueError("Cannot provide both 'gen_model' and 'gen_model_factory'. Choose one.")
        if ref_model is not None and ref_model_factory is not None:
            raise ValueError("Cannot provide both 'ref_model' and 'ref_model_factory'. Choose one.")
        if gen_model_factory is not None:
            kwargs["gen_model_factory"] = gen_model_factory
        if ref_model_factory is not None:
            kwargs["ref_model_factory"] = ref_model_factory
        super().__init__(
            {"gen_model": gen_model, "ref_model": ref_model, **kwargs},
            num_cpus=1 if num_cpus is None else num_cpus,
            num_gpus=num_gpus,
            device=device,
            actor_name=actor_name,
            client=client,
            address=address,
        )
