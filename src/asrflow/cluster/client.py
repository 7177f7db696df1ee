"""Open a Dask client from the ``dask`` config section and run sharded work on it.

Work is always cut into shards fixed by the data (never by the worker count), results come
back in shard order, and a task on a worker that dies is rescheduled by the scheduler, so a
stage's output does not depend on how many workers ran it or whether one crashed.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from asrflow.cluster.cache import budget_plugin

T = TypeVar("T")
SLURM_WORKERS = 4  # worker jobs when dask.cluster is slurm and dask.workers is null
R = TypeVar("R")


def shard(items: Sequence[T], size: int) -> list[list[T]]:
    """Cut ``items`` into consecutive shards of ``size`` (the last may be shorter)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last one shorter) from any iterable, made as they are asked for."""
    if size < 1:
        raise ValueError("chunk size must be at least 1")
    group: list[T] = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


@contextmanager
def dask_client(dask_cfg: dict[str, Any], workers: int | None = None, log=print) -> Iterator[Any]:
    """Yield a ``distributed.Client`` for the configured cluster and close what it opened.

    Args:
        dask_cfg: the resolved ``dask`` config section.
        workers: worker processes for a LocalCluster when ``dask.workers`` is null
            (Snakemake passes the rule's threads); defaults to 1. With ``cluster: slurm``
            the workers are ``dask.workers`` (else 4) Slurm jobs of ``dask.slurm``'s shape.
        log: where to print the dashboard link.
    """
    from dask.distributed import Client, LocalCluster

    if dask_cfg["cluster"] == "address":
        if not dask_cfg.get("address"):
            raise ValueError("config key 'dask.address' is required when dask.cluster is 'address'")
        client = Client(dask_cfg["address"], timeout="30s")
        cluster = None
    elif dask_cfg["cluster"] == "slurm":
        n = dask_cfg.get("workers") or SLURM_WORKERS
        cluster = slurm_cluster(dask_cfg)
        cluster.scale(jobs=n)
        client = Client(cluster)
        try:
            wait_for_slurm_workers(client, cluster, dask_cfg["slurm"], log)
        except BaseException:
            client.close()
            cluster.close()
            raise
    else:
        n = dask_cfg.get("workers") or workers or 1
        host = dask_cfg["host"]
        environ = dict(os.environ)
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=n > 1 or not dask_cfg.get("single_worker_thread", True),
            protocol="tcp",
            host=host,
            dashboard_address=f"{host}:0",  # a free port on the configured host, never 8787 clashes
            silence_logs=logging.ERROR,
        )
        restore_environ(environ)
        client = Client(cluster)
    try:
        if "cache_mb" in dask_cfg:  # a validated config has it; else the workers keep the default budget
            client.register_plugin(budget_plugin(dask_cfg["cache_mb"] * 2**20))
        if dask_cfg["dashboard"] and client.dashboard_link:
            log(f"Dask dashboard: {client.dashboard_link}")
        log(f"Dask scheduler {client.scheduler.address} with {len(client.scheduler_info()['workers'])} workers")
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def lost_worker(exc: BaseException) -> str | None:
    """What to tell the user when ``exc`` is Dask's report of a worker that died or was dropped mid-stage (its
    results, or data scattered to it, are gone: ``KilledWorker``, ``FutureCancelledError``), else None."""
    from distributed import KilledWorker
    from distributed.client import FutureCancelledError

    if not isinstance(exc, (KilledWorker, FutureCancelledError)):
        return None
    return (f"a Dask worker was lost while this stage ran ({exc}): it died, ran out of memory or stopped "
            f"answering the scheduler. Run the stage again (snakemake: add --rerun-incomplete); GMM training "
            f"resumes from its last finished iteration (its --state folder), other stages start over")


def peak_rss_mb() -> float:
    """This process's own peak resident memory so far (MB): Linux's ``VmHWM``.

    Not ``ru_maxrss``: Linux keeps it across ``fork`` and ``exec``, so a stage started by a large
    process (Snakemake, a benchmark's driver holding a Dask scheduler, a nanny) reports at least that
    process's size (a 15 MB child of a 300 MB parent reports 314 MB). ``ru_maxrss`` only where
    ``/proc`` is missing.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Start this process's peak resident memory (``VmHWM``) again from what it holds now (Linux:
    ``clear_refs`` 5), so the next peak is that of the work that follows; whether it could."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def peak_memory(client: Any) -> dict[str, float]:
    """Peak resident memory (MB) so far of this process (a stage's driver) and of its largest Dask worker
    (the driver's own where the workers cannot be asked)."""
    driver = peak_rss_mb()
    try:
        workers = list(client.run(peak_rss_mb).values())
    except Exception:  # noqa: BLE001  (a report, never a reason to fail the stage)
        workers = []
    return {"peak_rss_driver_mb": round(driver, 1), "peak_rss_worker_mb": round(max(workers, default=driver), 1)}


def restore_environ(saved: dict[str, str]) -> None:
    """Put this process's environment back to ``saved``.

    Dask's nannies set their workers' variables (``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``,
    ``MALLOC_TRIM_THRESHOLD_``, ...) in the parent's ``os.environ`` to spawn them and leave them
    there, where every later subprocess of the stage (or of a test session) would inherit them:
    GNU ``nproc`` then says 1.
    """
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def slurm_options(dask_cfg: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of dask-jobqueue's ``SLURMCluster`` for the ``dask`` config section.

    One worker process per Slurm job, started with this interpreter (the job inherits the
    environment, so the same virtual environment). Without ``dask.slurm.interface`` the
    scheduler binds to ``dask.host`` and each worker to the address that reaches it.
    """
    slurm = dask_cfg["slurm"]
    options: dict[str, Any] = {
        "cores": slurm["cores"],
        "processes": 1,
        "memory": slurm["memory"],
        "queue": slurm["partition"],
        "account": slurm["account"],
        "walltime": slurm["walltime"],
        "job_name": "asrflow-dask",
        "job_extra_directives": list(slurm["job_extra"]),
        "log_directory": slurm["log_directory"],
        "python": sys.executable,
        "silence_logs": "error",
    }
    if slurm["interface"]:
        options["interface"] = slurm["interface"]
    else:
        options["scheduler_options"] = {"host": dask_cfg["host"], "dashboard_address": f"{dask_cfg['host']}:0"}
    return options


def slurm_cluster(dask_cfg: dict[str, Any]) -> Any:
    """A dask-jobqueue ``SLURMCluster`` (no workers yet) from the ``dask`` config section."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as err:  # pragma: no cover - a dependency of the package
        raise RuntimeError("dask.cluster is 'slurm' but dask-jobqueue is not installed "
                           "(pip install dask-jobqueue)") from err
    options = slurm_options(dask_cfg)
    if options["log_directory"]:  # made here: stages starting together would race in dask-jobqueue's makedirs
        Path(options["log_directory"]).mkdir(parents=True, exist_ok=True)
    return SLURMCluster(**options)


def wait_for_slurm_workers(client: Any, cluster: Any, slurm: dict[str, Any], log=print) -> None:
    """Wait until the first worker job has connected; fail with the queue's view if none does."""
    try:
        client.wait_for_workers(1, timeout=slurm["start_timeout"])
    except TimeoutError as err:
        jobs = ", ".join(sorted(str(job) for job in cluster.workers)) or "none"
        raise RuntimeError(
            f"no Dask worker started within {slurm['start_timeout']} s on Slurm partition "
            f"'{slurm['partition']}' (worker jobs: {jobs}); check `squeue` and dask.slurm in the config"
        ) from err
    job_ids = sorted(str(getattr(job, "job_id", name)) for name, job in cluster.workers.items())
    log(f"Dask workers are Slurm jobs on partition {slurm['partition']}: {' '.join(job_ids)}")


def homes(client: Any, count: int) -> list[list[str] | None]:
    """The worker each of ``count`` shards goes to: shard ``i`` to the ``i``-th worker (by address) modulo
    their number, the same worker every time the shards run while the workers stay, so that what a worker
    caches of its shards (:mod:`asrflow.cluster.cache`) serves it again. A loose preference: a busy or
    lost worker's shards go elsewhere."""
    workers = workers_now(client)
    return [[workers[i % len(workers)]] if workers else None for i in range(count)]


def placed(home: list[str] | None) -> dict[str, Any]:
    """``client.submit`` arguments that prefer the worker ``home`` (a loose preference), or nothing when no
    worker is known (Dask refuses ``allow_other_workers`` without ``workers``)."""
    return {"workers": home, "allow_other_workers": True} if home else {}


#: Shards given to a worker ahead of the one it runs: enough that it never waits for the driver, few enough that
#: what a worker holds of the work to come (its tasks' arguments) does not grow with the corpus. (Dask sends a
#: task with a worker preference to that worker at once: submitted together, every shard's arguments would wait
#: in its worker's memory.)
AHEAD = 2


class Feed:
    """The order shards are submitted in: each worker's own shards (``home``, from :func:`homes`) in shard order,
    :data:`AHEAD` of them at first and one more each time one of them finishes. A worker that has run all its own
    then takes the next shard of the worker with the most left, when that one has more left than it holds ahead
    (Dask cannot steal shards not yet submitted); otherwise shards keep their worker, and its caches serve them.
    A worker that joins later (a Slurm job that started late) is given shards the same way (:meth:`join`)."""

    def __init__(self, home: Sequence[list[str] | None], ahead: int = AHEAD) -> None:
        self.ahead = ahead
        self.queues: dict[str, deque[int]] = {}
        for i, where in enumerate(home):
            self.queues.setdefault(where[0] if where else "", deque()).append(i)
        self.sent: dict[int, str] = {}  # submitted and not finished: the worker each went to ("": any)

    @property
    def left(self) -> int:
        """Shards not submitted yet."""
        return sum(len(queue) for queue in self.queues.values())

    def first(self) -> list[tuple[int, list[str] | None]]:
        """The shards to submit at the start, each with the worker it goes to: the first ``ahead`` of every
        worker's, in shard order."""
        first = [(queue.popleft(), worker) for worker, queue in self.queues.items()
                 for _ in range(min(self.ahead, len(queue)))]
        return [self._send(i, worker) for i, worker in sorted(first)]

    def after(self, done: int) -> tuple[int, list[str] | None] | None:
        """The shard to submit now that shard ``done`` has finished, with the worker it goes to (the one ``done``
        went to); None when every shard has been submitted."""
        worker = self.sent.pop(done, "")
        queue = self.queues.get(worker) or self._behind()
        return self._send(queue.popleft(), worker) if queue else None

    def join(self, workers: Iterable[str]) -> list[tuple[int, list[str] | None]]:
        """Shards for those of ``workers`` the feed has not met: up to ``ahead`` each, from the worker furthest
        behind."""
        given = []
        for worker in workers:
            if worker in self.queues:
                continue
            self.queues[worker] = deque()
            for _ in range(self.ahead):
                if (queue := self._behind()) is None:
                    break
                given.append(self._send(queue.popleft(), worker))
        return given

    def _behind(self) -> deque[int] | None:
        """The queue of the worker with the most left, when it has more left than it holds ahead."""
        queue = max(self.queues.values(), key=len, default=None)
        return queue if queue is not None and len(queue) > self.ahead else None

    def _send(self, i: int, worker: str) -> tuple[int, list[str] | None]:
        self.sent[i] = worker
        return i, [worker] if worker else None


class Joined:
    """Shards of a :class:`Feed` for workers that joined the cluster since it began, looked for at most every
    ``every`` seconds while shards are left (the call asks the scheduler)."""

    def __init__(self, client: Any, feed: Feed, every: float = 1.0) -> None:
        self.client, self.feed, self.every = client, feed, every
        self.checked = time.monotonic()

    def __call__(self) -> list[tuple[int, list[str] | None]]:
        if not self.feed.left or time.monotonic() - self.checked < self.every:
            return []
        self.checked = time.monotonic()
        return self.feed.join(workers_now(self.client))


def workers_now(client: Any) -> list[str]:
    """The addresses of the cluster's workers now."""
    return sorted(client.scheduler_info().get("workers", {}))


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
    """Run ``fn(shard, *args, **kwargs)`` for each shard on the cluster, shard ``i`` on its home worker
    (:func:`homes`), a few at a time (:class:`Feed`); results in shard order.

    A progress bar (stderr) counts ``units`` (for example utterances per shard) as shards finish.
    """
    results: list[Any] = [None] * len(shards)
    for i, result in iter_sharded(client, fn, shards, *args, units=units, desc=desc, unit=unit, retries=retries,
                                  **kwargs):
        results[i] = result
    return results


def iter_sharded(
    client: Any,
    fn: Callable[..., R],
    shards: Sequence[Any],
    *args: Any,
    units: Sequence[int] | None = None,
    desc: str = "",
    unit: str = "utt",
    retries: int = 2,
    **kwargs: Any,
) -> Iterator[tuple[int, R]]:
    """:func:`run_sharded`'s work, its results as ``(shard index, result)`` in the order the shards finish, each
    released on the cluster once given: a caller that folds them in as they come holds only what it keeps."""
    from dask.distributed import as_completed

    units = list(units) if units is not None else [1] * len(shards)
    token = uuid.uuid4().hex[:8]
    name = desc or fn.__name__
    feed = Feed(homes(client, len(shards)))
    index: dict[str, int] = {}

    def submit(i: int, where: list[str] | None) -> Any:
        future = client.submit(fn, shards[i], *args, pure=False, retries=retries, key=f"{name}-{token}-{i}",
                               priority=-i, **placed(where), **kwargs)
        index[future.key] = i
        return future

    pending = as_completed([submit(i, where) for i, where in feed.first()])
    joined = Joined(client, feed)
    with tqdm(total=sum(units), desc=desc, unit=unit, file=sys.stderr, mininterval=1.0,
              disable=None if sys.stderr.isatty() else False) as bar:
        for future in pending:
            i = index.pop(future.key)
            result = future.result()
            future.release()
            if (following := feed.after(i)) is not None:
                pending.add(submit(*following))
            for given in joined():
                pending.add(submit(*given))
            bar.update(units[i])
            yield i, result


def stream_sharded(
    client: Any,
    fn: Callable[..., R],
    shards: Iterable[Any],
    *args: Any,
    window: int | None = None,
    units: Callable[[Any], int] = len,
    total: int | None = None,
    desc: str = "",
    unit: str = "utt",
    retries: int = 2,
    **kwargs: Any,
) -> Iterator[R]:
    """``fn(shard, *args, **kwargs)`` for each shard as ``shards`` makes them, results in shard order, with at
    most ``window`` shards submitted and not yet given back (default: two per worker, plus two): a stage that
    streams its input through the cluster and writes each result as it comes holds a window of shards, not the
    corpus. Shard ``i`` goes to the ``i``-th worker modulo their number (:func:`homes`); the progress bar
    counts ``units(shard)`` per shard, of ``total`` when known.
    """
    workers = sorted(client.scheduler_info().get("workers", {}))
    window = window or 2 * max(len(workers), 1) + 2
    token = uuid.uuid4().hex[:8]
    name = desc or fn.__name__
    pending: deque[tuple[Any, int]] = deque()
    with tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, mininterval=1.0,
              disable=None if sys.stderr.isatty() else False) as bar:

        def oldest() -> R:
            future, units = pending.popleft()
            result = future.result()
            future.release()
            bar.update(units)
            return result

        for i, item in enumerate(shards):
            home = [workers[i % len(workers)]] if workers else None
            pending.append((client.submit(fn, item, *args, pure=False, retries=retries, key=f"{name}-{token}-{i}",
                                          **placed(home), **kwargs), units(item)))
            if len(pending) >= window:
                yield oldest()
        while pending:
            yield oldest()


#: Chains a reduction folds its shards into (in shard order) before a binary tree sums the chains: a fixed number,
#: so the tree's depth, and the partial results a worker holds, do not grow with the corpus.
REDUCE_CHAINS = 16


def run_reduced(
    client: Any,
    fn: Callable[..., R],
    shards: Sequence[Any],
    *args: Any,
    combine: Callable[[R, R], R],
    units: Sequence[int] | None = None,
    desc: str = "",
    unit: str = "utt",
    retries: int = 2,
    chains: int = REDUCE_CHAINS,
    **kwargs: Any,
) -> R:
    """``fn(shard, *args, **kwargs)`` for each shard, combined on the workers; only the total reaches the driver.

    The shards are cut into ``chains`` runs of consecutive shards; each run's results are folded in shard order
    (``combine(combine(r0, r1), r2)``, ... as Kaldi's ``gmm-sum-accs`` adds one job's accumulator after
    another), and the runs' totals are combined pairwise in a fixed binary tree. The shape depends only on the
    number of shards, so the total is the same whatever the workers or the order the shards finish in. A
    chain's shards run on the worker that keeps its running sum, in shard order, a few submitted at a time
    (:class:`Feed`), and a combination outranks every shard not yet started, so each result is folded as soon as
    it exists and released: a worker holds the running sum of the chain it works on, a few chains' totals until
    the tree takes them and the arguments of a few shards to come, whatever the corpus. (Shards run out of
    order, or a chain's shards spread over workers running at different paces, would leave results waiting for
    their turn in the chain: a number that grows with the shards of a chain, and so with the corpus.)
    """
    from dask.distributed import as_completed

    if not shards:
        raise ValueError(f"{desc or fn.__name__}: no shards to run")
    units = list(units) if units is not None else [1] * len(shards)
    token = uuid.uuid4().hex[:8]
    name = desc or fn.__name__
    size = -(-len(shards) // max(1, chains))  # shards per chain
    keeper = homes(client, -(-len(shards) // size))  # a chain's shards and its running sum on one worker
    feed = Feed([keeper[i // size] for i in range(len(shards))])
    totals: list[Any] = [None] * len(keeper)  # each chain's running sum so far
    tree = SumTree(len(keeper), lambda left, right, depth, j: client.submit(
        combine, left, right, pure=False, retries=retries, key=f"{name}-{token}-sum{depth}-{j}", priority=depth))
    index: dict[str, int] = {}

    def submit(i: int, where: list[str] | None) -> Any:
        """Shard ``i``'s task and its fold into its chain's running sum (the chain's shards come in order); the
        chain's total to the tree after its last shard."""
        leaf = client.submit(fn, shards[i], *args, pure=False, retries=retries, key=f"{name}-{token}-{i}",
                             **placed(where), priority=-i, **kwargs)
        index[leaf.key] = i
        c = i // size
        totals[c] = leaf if totals[c] is None else client.submit(
            combine, totals[c], leaf, pure=False, retries=retries, key=f"{name}-{token}-fold{i}",
            **placed(keeper[c]), priority=1)
        if i == min((c + 1) * size, len(shards)) - 1:  # the chain's total: the tree's from now on
            tree.put(c, totals[c])
            totals[c] = None
        return leaf

    pending = as_completed([submit(i, where) for i, where in feed.first()])
    joined = Joined(client, feed)
    with tqdm(total=sum(units), desc=desc, unit=unit, file=sys.stderr, mininterval=1.0,
              disable=None if sys.stderr.isatty() else False) as bar:
        for future in pending:
            if future.status == "error":
                future.result()  # raises the shard's error
            i = index.pop(future.key)
            if (following := feed.after(i)) is not None:
                pending.add(submit(*following))
            for given in joined():
                pending.add(submit(*given))
            bar.update(units[i])
            del future  # released when no fold or combination still to submit holds it
    return tree.root.result()


class SumTree:
    """The chains' totals combined pairwise in a fixed binary tree (``((c0, c1), (c2, c3)), c4``: an odd last node
    goes up as it is), each combination submitted as soon as both its halves are final, so that totals do not
    wait on the workers for chains still running elsewhere."""

    def __init__(self, count: int, pair: Callable[[Any, Any, int, int], Any]) -> None:
        self.pair = pair  # (left, right, depth, node) -> the future of their combination (depth 2: the chains')
        self.sizes = [count]
        while self.sizes[-1] > 1:
            self.sizes.append(-(-self.sizes[-1] // 2))
        self.waiting: dict[tuple[int, int], Any] = {}
        self.root: Any = None

    def put(self, j: int, total: Any, level: int = 0) -> None:
        """Node ``j`` of ``level`` (0: the chains) is final."""
        size = self.sizes[level]
        if size == 1:
            self.root = total
        elif j == size - 1 and size % 2:
            self.put(j // 2, total, level + 1)
        elif (sibling := self.waiting.pop((level, j ^ 1), None)) is None:
            self.waiting[(level, j)] = total
        else:
            left, right = (total, sibling) if j % 2 == 0 else (sibling, total)
            self.put(j // 2, self.pair(left, right, level + 2, j // 2), level + 1)


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
