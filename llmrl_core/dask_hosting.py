"""Build an object inside a Dask actor and call it from here: how llmrl runs TorchRL's Ray-hosted classes.

TorchRL's ``RayLLMCollector``, ``RayKLRewardTransform`` and ``RayRetrieveKL`` build their object (a collector, a
transform holding a reference model) in a Ray actor and forward calls to it. llmrl has no Ray: :class:`DaskHost`
builds the object in a Dask actor on a worker, the way :class:`~llmrl_core.collectors.dask_collector.DaskLLMCollector`
keeps each engine in a :class:`~llmrl_core.collectors.dask_collector.RolloutActor` (``client.submit(cls, ...,
actor=True)``), and :meth:`DaskHost.call` runs a method of the object there and returns its result. The object is
built on the worker (from a class, a factory, or a ``"module:attribute"`` path imported there), so a model made by
a factory never travels; arguments and results travel pickled. A Dask actor runs its calls one at a time.

Which cluster (in this order): ``client=``; ``address=`` (a client to that scheduler, closed with the host); the
current client (``distributed.get_client()``: the one a script made, or the worker's own inside a Dask task);
else a local cluster owned by the host: one worker process on 127.0.0.1 (``threads_per_worker=1``, no dashboard,
no memory limit: a resident model is not data to spill). An owned cluster is closed by :meth:`DaskHost.close`, by
leaving a ``with`` block, when the host is garbage-collected, or at interpreter exit. Its client is not made the
default one, so each host that finds no client owns a cluster of its own (Ray gives each actor its own process).

Ray's resource arguments, mapped to Dask (:func:`dask_resources`):

* ``num_gpus`` > 0 becomes the Dask resource ``{"GPU": num_gpus}``: the actor goes to a worker started with
  ``--resources "GPU=n"`` (an owned cluster declares the GPUs this machine has). A cluster where no worker declares
  enough is a ``ValueError`` at once (Dask would wait forever for such a worker). ``num_gpus`` 0 or None: none.
* ``num_cpus`` is recorded (:attr:`DaskHost.num_cpus`). Dask workers declare no CPU resource (their thread count
  is their own): on an owned cluster it sets the worker's torch thread count (as Ray gives an actor
  ``OMP_NUM_THREADS=num_cpus``); on a cluster you bring, start the workers with the threads you want.
* ``actor_name`` becomes the actor's Dask key: a second host with the same name on the same scheduler, while the
  first is alive, gets the same actor (Ray's reuse of a named actor); its own constructor arguments are unused.
* ``device`` (the hosted object's device) is checked on the worker before the object is built: a CUDA device on a
  worker without CUDA is a ``RuntimeError`` naming the worker, not a hang.
* Ray settings with no Dask meaning (``ray_init_config``, ``remote_config``, ``runtime_env``, ...) are refused by
  :func:`refuse_ray_only` with a ``ValueError`` that names the argument, unless they are None.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import distributed

__all__ = ["RAY_ONLY_ARGUMENTS", "DaskHost", "HostActor", "dask_resources", "refuse_ray_only"]

# Ray options that have no Dask counterpart: refused unless None (see refuse_ray_only).
RAY_ONLY_ARGUMENTS = (
    "ray_init_config",
    "remote_config",
    "runtime_env",
    "lifetime",
    "namespace",
    "max_concurrency",
    "max_restarts",
    "max_task_retries",
    "placement_group",
    "scheduling_strategy",
)


def refuse_ray_only(owner: str, **arguments: Any) -> None:
    """Raise ``ValueError`` for the first of ``arguments`` (Ray-only settings of ``owner``) that is not None."""
    for name, value in arguments.items():
        if value is not None:
            raise ValueError(
                f"{owner}: {name}={value!r} is a Ray setting, and {owner} runs on Dask (llmrl_core.dask_hosting), "
                f"where it has no meaning. Leave {name} unset; choose the Dask cluster with client= or address= "
                "(or an active distributed.Client), and its resources with num_gpus=."
            )


def dask_resources(num_gpus: float | None) -> dict[str, float]:
    """The Dask resources an actor asks for: ``{"GPU": num_gpus}`` when ``num_gpus`` > 0, else none."""
    if num_gpus is None or num_gpus == 0:
        return {}
    if num_gpus < 0:
        raise ValueError(f"num_gpus must be >= 0, got {num_gpus}")
    return {"GPU": float(num_gpus)}


def _resolve(build: Any) -> Callable[..., Any]:
    """``build`` itself, or the attribute a ``"package.module:attribute"`` path names (imported here)."""
    if isinstance(build, str):
        module, _, attribute = build.partition(":")
        if not attribute:
            raise ValueError(f"a build path is 'package.module:attribute', got {build!r}")
        return getattr(importlib.import_module(module), attribute)
    if not callable(build):
        raise TypeError(
            f"DaskHost builds its object from a class, a factory or a 'module:attribute' path, got {build!r}"
        )
    return build


def _check_device(device: Any) -> None:
    """A CUDA ``device`` on a process without (enough) CUDA devices is a RuntimeError naming this worker."""
    if device is None:
        return
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available == 0 or (device.index is not None and device.index >= available):
        try:
            where = f"the Dask worker {distributed.get_worker().address}"
        except ValueError:
            where = "this process"
        raise RuntimeError(
            f"device={str(device)!r} was asked for, but {where} has {available} CUDA device(s) "
            "(torch.cuda.is_available() is False or the index is out of range): host the object on a worker with "
            "a GPU (num_gpus=1 and a worker started with --resources 'GPU=1'), or leave device unset / use 'cpu'."
        )


class HostActor:
    """The Dask actor: builds the object on its worker and runs the calls :class:`DaskHost` sends it."""

    def __init__(self, recipe: tuple[Any, tuple, Mapping[str, Any]], device: Any = None) -> None:
        _check_device(device)
        build, args, kwargs = recipe  # (class / factory / path, args, kwargs)
        self.obj = _resolve(build)(*args, **dict(kwargs))
        self._iterator: Iterator[Any] | None = None

    def call(self, method: str, args: tuple = (), kwargs: Mapping[str, Any] | None = None) -> Any:
        """``obj.<method>(*args, **kwargs)``; a method that returns its own object (a chained call such as
        ``reset_dataloader()``) returns None: the object stays here, it is not pickled back."""
        result = getattr(self.obj, method)(*args, **dict(kwargs or {}))
        return None if result is self.obj else result

    def get(self, name: str) -> Any:
        """``obj.<name>`` (properties included)."""
        return getattr(self.obj, name)

    def set(self, name: str, value: Any) -> None:
        """``obj.<name> = value``."""
        setattr(self.obj, name, value)

    def has(self, name: str) -> bool:
        """Whether ``obj`` has ``name``."""
        return hasattr(self.obj, name)

    def next_item(self) -> tuple[bool, Any]:
        """``(True, item)``: the next item of ``iter(obj)`` (one iteration kept across calls); ``(False, None)``
        when it is exhausted, after which the next call starts a new iteration."""
        if self._iterator is None:
            self._iterator = iter(self.obj)
        try:
            return True, next(self._iterator)
        except StopIteration:
            self._iterator = None
            return False, None

    def restart_iteration(self) -> None:
        """Drop the running iteration (the next :meth:`next_item` starts a new one)."""
        close = getattr(self._iterator, "close", None)
        self._iterator = None
        if callable(close):
            close()

    def where(self) -> dict[str, Any]:
        """The worker address and process id the object lives in."""
        return {"worker": distributed.get_worker().address, "pid": os.getpid()}


def _set_torch_threads(count: int) -> int:
    import torch

    torch.set_num_threads(int(count))
    return torch.get_num_threads()


class _Lease:
    """What a host holds on the cluster: the actor's future, and the client/cluster it started (if any)."""

    def __init__(self) -> None:
        self.future: Any = None
        self.client: Any = None  # closed with the lease when owned
        self.cluster: Any = None  # an owned LocalCluster
        self.owns_client = False
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _LEASES.discard(self)
        future, self.future = self.future, None
        try:
            if future is not None and self.client is not None and self.client.status == "running":
                future.release()  # the worker drops the actor once no client holds its key
        except Exception:  # the cluster may already be gone (interpreter exit)
            pass
        for closing in ([self.client] if self.owns_client else []) + [self.cluster]:
            if closing is not None:
                try:
                    closing.close()
                except Exception:
                    pass
        self.client = self.cluster = None


_LEASES: set[_Lease] = set()
_LEASES_LOCK = threading.Lock()


@atexit.register
def _close_leases() -> None:  # registered after distributed's own exit hooks, so it runs before them
    for lease in list(_LEASES):
        lease.close()


@contextmanager
def _spawn_without_main() -> Iterator[None]:
    """Start worker processes without re-running the caller's ``__main__`` in them.

    Dask spawns its worker processes, and a spawned process imports the parent's main script first: a script that
    builds a hosted object at top level (as TorchRL's examples do with Ray) would build it again in the worker,
    and fail, unless guarded by ``if __name__ == "__main__":``. The worker does not need the script (Dask pickles
    functions and classes of ``__main__`` by value), so while the cluster starts, ``__main__`` hides the two
    attributes ``multiprocessing`` reads to find it (``__spec__``, ``__file__``); they are restored after.
    """
    main = sys.modules.get("__main__")
    saved = {name: main.__dict__[name] for name in ("__spec__", "__file__") if main and name in main.__dict__}
    if main is not None:
        main.__dict__.pop("__file__", None)
        main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _local_cluster(num_gpus: float | None, lease: _Lease) -> Any:
    """Start the owned one-worker cluster on 127.0.0.1 (its GPUs declared when ``num_gpus`` asks for some)."""
    resources = {}
    if dask_resources(num_gpus):
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < num_gpus:
            raise ValueError(
                f"num_gpus={num_gpus}: this machine has {gpus} CUDA GPU(s) for the local Dask worker. Use "
                "num_gpus=0 here, or pass client=/address= of a Dask cluster whose workers declare GPU resources."
            )
        resources = {"GPU": float(gpus)}
    with _spawn_without_main(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Port .* is already in use")  # its HTTP server moves on
        lease.cluster = distributed.LocalCluster(
            n_workers=1,
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
            memory_limit=0,
            **({"resources": resources} if resources else {}),
        )
    lease.client = distributed.Client(lease.cluster, set_as_default=False)
    lease.owns_client = True
    return lease.client


def _check_resources(client: Any, resources: Mapping[str, float], owner: str) -> None:
    """Some worker must declare ``resources``, else Dask would keep the actor waiting forever: ValueError."""
    if not resources:
        return
    workers = client.scheduler_info()["workers"]
    declared = {address: w.get("resources", {}) for address, w in workers.items()}
    if not any(all(r.get(k, 0) >= v for k, v in resources.items()) for r in declared.values()):
        raise ValueError(
            f"{owner}: no worker of the Dask cluster at {client.scheduler.address} declares the resources "
            f"{resources} that num_gpus asks for (workers: {declared or 'none'}). Start a worker with "
            f"--resources 'GPU={int(max(resources.values()))}', or use num_gpus=0."
        )


class DaskHost:
    """An object built in a Dask actor (see the module docstring); :meth:`call` runs its methods there.

    Args:
        build: a class or factory, or a ``"package.module:attribute"`` path imported on the worker.
        args / kwargs: its arguments (pickled to the worker).

    Keyword Args:
        client / address: the cluster (default: the current client, else an owned local cluster).
        num_cpus / num_gpus: Ray's resource arguments (see the module docstring).
        actor_name: the actor's Dask key (a live actor with that key is reused).
        device: the device the object will use, checked on the worker first.
        name: what error messages call the hosted class (default: ``build``'s name).
    """

    def __init__(
        self,
        build: Any,
        args: tuple = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        client: Any = None,
        address: str | None = None,
        num_cpus: int | None = None,
        num_gpus: float | None = None,
        actor_name: str | None = None,
        device: Any = None,
        name: str | None = None,
    ) -> None:
        if client is not None and address is not None:
            raise ValueError("pass client= or address=, not both")
        self.name = name or (build.rpartition(":")[2] if isinstance(build, str) else getattr(build, "__name__", "obj"))
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.resources = dask_resources(num_gpus)
        self.actor_name = actor_name
        self._lease = lease = _Lease()
        with _LEASES_LOCK:
            _LEASES.add(lease)
        self._finalizer = weakref.finalize(self, lease.close)
        try:
            if client is None and address is not None:
                client = lease.client = distributed.Client(address, set_as_default=False)
                lease.owns_client = True
            elif client is None:
                try:
                    client = distributed.get_client()
                except ValueError:  # no client here: start the host's own cluster
                    client = _local_cluster(num_gpus, lease)
            lease.client = client
            if lease.cluster is None:
                _check_resources(client, self.resources, self.name)
            if lease.cluster is not None and num_cpus:
                client.run(_set_torch_threads, int(num_cpus))
            key = actor_name or f"{self.name}-{uuid.uuid4().hex}"
            # the recipe (a model passed directly can be large) goes straight to a worker, not into the task graph
            [recipe] = client.scatter([(build, tuple(args), dict(kwargs or {}))], hash=False)
            lease.future = client.submit(
                HostActor, recipe, device, actor=True, key=key, resources=self.resources or None, pure=False
            )
            self._actor = lease.future.result()
            recipe.release()
            self._actor._client = client  # calls go through this client, not whichever one is the default
        except BaseException:
            self.close()
            raise
        self.client = client

    # --- calls -----------------------------------------------------------------------------------
    @property
    def actor(self) -> Any:
        """The Dask actor handle (``distributed.Actor``); RuntimeError once the host is closed."""
        if self._lease.closed:
            raise RuntimeError(f"{self.name} was closed: its Dask actor is gone")
        return self._actor

    def submit(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """Start ``obj.<method>(*args, **kwargs)`` in the actor; returns a future (``.result()`` blocks)."""
        return self.actor.call(method, args, kwargs)

    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """``obj.<method>(*args, **kwargs)`` in the actor; its result (or its exception) comes back here."""
        return self.submit(method, *args, **kwargs).result()

    def get(self, attribute: str) -> Any:
        """``obj.<attribute>`` (properties included)."""
        return self.actor.get(attribute).result()

    def set(self, attribute: str, value: Any) -> None:
        """``obj.<attribute> = value``."""
        self.actor.set(attribute, value).result()

    def has(self, attribute: str) -> bool:
        """Whether the hosted object has ``attribute``."""
        return bool(self.actor.has(attribute).result())

    def submit_next(self) -> Any:
        """Start fetching the next item of the hosted object's iteration: a future of ``(has_item, item)``."""
        return self.actor.next_item()

    def restart_iteration(self) -> None:
        """Drop the hosted object's running iteration."""
        self.actor.restart_iteration().result()

    def where(self) -> dict[str, Any]:
        """``{"worker": address, "pid": process id}`` of the actor."""
        return self.actor.where().result()

    # --- life --------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._lease.closed

    @property
    def owns_cluster(self) -> bool:
        """Whether this host started (and will close) its own local cluster."""
        return self._lease.cluster is not None

    def close(self) -> None:
        """Release the actor; close the client and cluster this host started. Idempotent."""
        self._finalizer()

    def __enter__(self) -> DaskHost:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """A pickled host (e.g. inside an env sent to a worker) reaches the same actor and owns nothing."""
        return {
            "name": self.name,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "actor": self._actor,
            "actor_name": self.actor_name,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name, self.num_cpus, self.num_gpus = state["name"], state["num_cpus"], state["num_gpus"]
        self.actor_name = state["actor_name"]
        self.resources = dask_resources(self.num_gpus)
        self._actor = state["actor"]
        self._lease = _Lease()  # owns nothing: closing a copy leaves the actor to its owner
        self._finalizer = weakref.finalize(self, self._lease.close)
        self.client = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"key={getattr(getattr(self, '_actor', None), 'key', None)!r}"
        return f"DaskHost({self.name}, {state})"
