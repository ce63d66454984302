"""A one-process local Dask cluster on 127.0.0.1 for tests that host an actor on a real worker."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def one_worker_cluster(local_directory: Path, as_default: bool = False) -> Iterator:
    """A ``Client`` of a ``LocalCluster`` with one single-threaded worker process (no dashboard, no memory limit:
    an engine or trainer actor is resident, not Dask data); closed on leaving. ``as_default``: the client Dask
    actor handles find by default (a handle used outside a task needs one)."""
    from distributed import Client, LocalCluster

    warnings.filterwarnings("ignore", message="Port .* is already in use")  # another cluster on this machine
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            memory_limit=0,
            local_directory=str(local_directory),
        ) as cluster,
        Client(cluster, set_as_default=as_default) as client,
    ):
        yield client
