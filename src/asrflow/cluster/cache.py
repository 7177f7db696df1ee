"""What a Dask worker keeps between tasks, within a memory budget.

GMM training visits every shard once per iteration, so each worker keeps the features and
compiled training graphs of the shards it ran (``asrflow.gmm.estep``); tasks go back to the
worker that ran them before (:func:`asrflow.cluster.client.run_sharded`), so a worker's cache
holds its own part of the split, not the whole of it. :class:`Cache` bounds it: past
``dask.cache_mb`` per worker the least recently used entries are dropped (and rebuilt when next
needed), so a worker's memory stays the same on 3 hours or 1,000.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

#: Bytes each worker process may cache (set on every worker from ``dask.cache_mb``: :func:`budget_plugin`).
DEFAULT_BUDGET = 1024 * 2**20
_budget = [DEFAULT_BUDGET]


def set_budget(nbytes: int) -> None:
    """The cache budget of this process, shared by its caches."""
    _budget[0] = max(0, int(nbytes))


class Cache:
    """Least-recently-used entries of at most the process's budget (times ``share``) of bytes in all."""

    def __init__(self, share: float = 1.0) -> None:
        self.share = share
        self.used = 0
        self.entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def get(self, key: Any, make: Callable[[], Any], size: Callable[[Any], int]) -> Any:
        """The entry of ``key``, made by ``make()`` (and kept, ``size(value)`` bytes) when it is not here."""
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            return hit[0]
        value = make()
        self.put(key, value, size(value))
        return value

    def put(self, key: Any, value: Any, nbytes: int) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used entries past the budget."""
        self.pop(key)
        budget = _budget[0] * self.share
        if nbytes > budget:
            return  # larger than the whole budget: used once, not kept
        self.entries[key] = (value, nbytes)
        self.used += nbytes
        while self.used > budget:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.used -= dropped

    def pop(self, key: Any) -> None:
        """Forget ``key``'s entry, if any."""
        hit = self.entries.pop(key, None)
        if hit is not None:
            self.used -= hit[1]

    def __iter__(self) -> Iterator[Any]:
        """The keys held, least recently used first."""
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
