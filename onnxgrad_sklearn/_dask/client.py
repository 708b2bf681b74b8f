"""The cluster a fit runs on: the ``distributed`` client (or none), the client of a
dask task's worker, what computes collections into memory, and the check that every
worker has this process's versions of the package and of onnxruntime.
"""

from __future__ import annotations

import contextlib
import sys


def _get_client():
    """The ``distributed`` client a fit trains with (``distributed.get_client()``), or None."""
    if "distributed" not in sys.modules:  # no client without it: not imported to tell
        return None
    from distributed import get_client

    try:
        return get_client()
    except ValueError:
        return None


def _in_task() -> bool:
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


@contextlib.contextmanager
def _client_context(client):
    """``client``, or inside a dask task a client of the worker that has left its thread
    pool for the while (``worker_client``): the fit's tasks can run on that worker."""
    if client is None or not _in_task():
        yield client
        return
    from distributed import worker_client

    with worker_client() as inner:
        yield inner


def _compute(scheduler, *values):
    import dask

    if scheduler is None:
        return dask.compute(*values)
    return dask.compute(*values, scheduler=scheduler)


# workers' versions ----------------------------------------------------------
def _versions() -> dict:
    """The versions of this package and of onnxruntime in this process."""
    from .._version import __version__
    from ..runtime import import_onnxruntime

    return {
        "onnxgrad_sklearn": __version__,
        "onnxruntime": import_onnxruntime().__version__,
    }


#: What ``client.run`` sends to each worker (a test replaces it).
_worker_versions = _versions


#: The workers found with this process's versions, by scheduler (and by the function
#: that reads them, which a test replaces): asked again only of new workers.
_CHECKED: dict = {}


def _workers_info(client) -> dict:
    """The scheduler's record of each worker (``{address: info}``), asked for now.

    Not ``client.scheduler_info()``: it returns the client's cached identity, which the
    client's periodic update (every 2 s, without the workers) may replace between the
    fetch and the return.
    """
    return client.sync(client.scheduler.identity, n_workers=-1).get("workers", {})


def _check_workers(client) -> None:
    """Refuse workers without this package, or with other versions of it or onnxruntime.

    Each worker process is asked once per process (by address and the scheduler's id
    of the worker, which a restarted worker does not keep).
    """
    here = _versions()
    info = _workers_info(client)
    if not info:
        raise RuntimeError("The dask cluster has no worker: start workers before fitting.")
    workers = {(a, w.get("id")) for a, w in info.items()}
    checked = _CHECKED.setdefault((client.scheduler.address, _worker_versions), set())
    new = sorted(workers - checked)
    found = {}
    if new:
        found = client.run(_worker_versions, workers=[a for a, _ in new], on_error="return")
    wanted = f"onnxgrad_sklearn {here['onnxgrad_sklearn']} with onnxruntime {here['onnxruntime']}"
    bad = []
    for address, versions in sorted(found.items()):
        if isinstance(versions, BaseException):
            bad.append(f"{address} cannot run this package ({versions})")
        elif versions != here:
            bad.append(
                f"{address} has onnxgrad_sklearn {versions.get('onnxgrad_sklearn')} with "
                f"onnxruntime {versions.get('onnxruntime')}"
            )
    if bad:
        raise RuntimeError(
            f"The dask workers need the versions this process has ({wanted}), and "
            + "; ".join(bad)
            + f". Install onnxgrad-sklearn=={here['onnxgrad_sklearn']} and the same "
            "onnxruntime on the workers (or fit without a distributed client: the data is "
            "then computed into memory here)."
        )
    checked.update(w for w in new if w[0] in found)
