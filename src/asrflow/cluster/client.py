"""Open a Dask client from the ``dask`` config section and run sharded work on it.

Work is always cut into shards fixed by the data (never by the worker count), results come
back in shard order, and a task on a worker that dies is rescheduled by the scheduler, so a
stage's output does not depend on how many workers ran it or whether one crashed.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")
R = TypeVar("R")


def shard(items: Sequence[T], size: int) -> list[list[T]]:
    """Cut ``items`` into consecutive shards of ``size`` (the last may be shorter)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


@contextmanager
def dask_client(dask_cfg: dict[str, Any], workers: int | None = None, log=print) -> Iterator[Any]:
    """Yield a ``distributed.Client`` for the configured cluster and close what it opened.

    Args:
        dask_cfg: the resolved ``dask`` config section.
        workers: worker processes for a LocalCluster when ``dask.workers`` is null
            (Snakemake passes the rule's threads); defaults to 1.
        log: where to print the dashboard link.
    """
    from dask.distributed import Client, LocalCluster

    if dask_cfg["cluster"] == "address":
        if not dask_cfg.get("address"):
            raise ValueError("config key 'dask.address' is required when dask.cluster is 'address'")
        client = Client(dask_cfg["address"], timeout="30s")
        cluster = None
    else:
        n = dask_cfg.get("workers") or workers or 1
        host = dask_cfg["host"]
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            host=host,
            dashboard_address=f"{host}:0",  # a free port on the configured host, never 8787 clashes
            silence_logs=logging.ERROR,
        )
        client = Client(cluster)
    try:
        if dask_cfg["dashboard"] and client.dashboard_link:
            log(f"Dask dashboard: {client.dashboard_link}")
        log(f"Dask scheduler {client.scheduler.address} with {len(client.scheduler_info()['workers'])} workers")
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_sharded(
    client: Any,
    fn: Callable[..., R],
    shards: Sequence[Any],
    *args: Any,
    units: Sequence[int] | None = None,
    desc: str = "",
    unit: str = "utt",
    retries: int = 2,
    **kwargs: Any,
) -> list[R]:
    """Run ``fn(shard, *args, **kwargs)`` for each shard on the cluster; results in shard order.

    A progress bar (stderr) counts ``units`` (for example utterances per shard) as shards finish.
    """
    from dask.distributed import as_completed

    units = list(units) if units is not None else [1] * len(shards)
    token = uuid.uuid4().hex[:8]
    name = desc or fn.__name__
    futures = [
        client.submit(fn, s, *args, pure=False, retries=retries, key=f"{name}-{token}-{i}", **kwargs)
        for i, s in enumerate(shards)
    ]
    index = {f.key: i for i, f in enumerate(futures)}
    results: list[Any] = [None] * len(futures)
    with tqdm(total=sum(units), desc=desc, unit=unit, file=sys.stderr, mininterval=1.0,
              disable=None if sys.stderr.isatty() else False) as bar:
        for future in as_completed(futures):
            i = index[future.key]
            results[i] = future.result()
            bar.update(units[i])
    return results


def broadcast(client: Any, data: Any, attempts: int = 3) -> Any:
    """Put ``data`` on every worker once (a future tasks can take as an argument).

    A worker that dies during the transfer makes ``scatter`` fail; the surviving and
    restarted workers get it on the next attempt.
    """
    for attempt in range(attempts):
        try:
            return client.scatter(data, broadcast=True, hash=False)
        except Exception:  # noqa: BLE001 (any transport error of a dying worker)
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")
