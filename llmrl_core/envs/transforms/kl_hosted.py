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

from typing import Any, Literal

from llmrl_core.envs.transforms.hosted import HostedTransform

__all__ = ["RayKLRewardTransform", "RayRetrieveKL"]


class RayKLRewardTransform(HostedTransform):
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


class RayRetrieveKL(HostedTransform):
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
