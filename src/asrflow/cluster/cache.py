"""What a Dask worker keeps between tasks, within a memory budget.

GMM training visits every shard once per iteration, so each worker keeps the compiled training
graphs of the shards it ran (``asrflow.gmm.estep``); tasks go back to the worker that ran them
before (:func:`asrflow.cluster.client.run_sharded`), so a worker's cache holds its own part of the
split, not the whole of it. :class:`Cache` bounds it at ``dask.cache_mb`` per worker, so a
worker's memory stays the same on 3 hours or 1,000.

A full cache keeps what it holds and builds the rest each time they are asked for, rather than
dropping its least recently used entries: the passes visit the same entries in the same order
every iteration, and least-recently-used eviction of such a cycle, larger than the cache, drops
every entry just before it is needed again (no hit at all), where keeping the first ones serves
that share of every pass.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

#: Bytes each worker process may cache (set on every worker from ``dask.cache_mb``: :func:`budget_plugin`).
DEFAULT_BUDGET = 256 * 2**20
_budget = [DEFAULT_BUDGET]


def set_budget(nbytes: int) -> None:
    """The cache budget of this process, shared by its caches."""
    _budget[0] = max(0, int(nbytes))


class Cache:
    """Entries of at most the process's budget (times ``share``) of bytes in all; once full, new entries are
    built and returned but not kept (see the module's docstring)."""

    def __init__(self, share: float = 1.0) -> None:
        self.share = share
        self.used = 0
        self.entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def get(self, key: Any, make: Callable[[], Any], size: Callable[[Any], int]) -> Any:
        """The entry of ``key``, made by ``make()`` (and kept, ``size(value)`` bytes) when it is not here."""
        hit = self.entries.get(key)
        if hit is not None:
            return hit[0]
        value = make()
        self.put(key, value, size(value))
        return value

    def put(self, key: Any, value: Any, nbytes: int) -> bool:
        """Keep ``value`` under ``key`` when it fits in what the budget leaves; whether it was kept."""
        self.pop(key)
        if self.used + nbytes > _budget[0] * self.share:
            return False
        self.entries[key] = (value, nbytes)
        self.used += nbytes
        return True

    def pop(self, key: Any) -> None:
        """Forget ``key``'s entry, if any."""
        hit = self.entries.pop(key, None)
        if hit is not None:
            self.used -= hit[1]

    def clear(self) -> None:
        """Forget every entry."""
        self.entries.clear()
        self.used = 0

    def __iter__(self) -> Iterator[Any]:
        """The keys held, oldest first."""
        return iter(list(self.entries))

    def __len__(self) -> int:
        return len(self.entries)


def budget_plugin(nbytes: int) -> Any:
    """A Dask worker plugin that gives every worker, including those started later, a cache budget of
    ``nbytes`` (``client.register_plugin``)."""
    from distributed import WorkerPlugin

    class CacheBudget(WorkerPlugin):
        name = "asrflow-cache-budget"

        def setup(self, worker: Any) -> None:
            set_budget(nbytes)

    return CacheBudget()
