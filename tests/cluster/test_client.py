import os
import time
from pathlib import Path

import pytest
from dask.distributed import Client, LocalCluster
from distributed.client import FutureCancelledError
from distributed.comm.core import CommClosedError

from asrflow.cluster import dask_client, run_sharded, shard
from asrflow.cluster.cache import DEFAULT_BUDGET
from asrflow.cluster.client import lost_worker, workers_now


def square_all(xs: list[int]) -> list[int]:
    return [x * x for x in xs]


def test_shard() -> None:
    assert shard(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert shard([], 3) == []


def test_attach_to_existing_scheduler_and_keep_order() -> None:
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1", protocol="tcp",
                      dashboard_address="127.0.0.1:0") as cluster:
        cfg = {"cluster": "address", "address": cluster.scheduler_address, "workers": None,
               "host": "127.0.0.1", "dashboard": True}
        lines: list[str] = []
        with dask_client(cfg, log=lines.append) as client:
            shards = shard(list(range(10)), 3)
            assert run_sharded(client, square_all, shards, units=[len(s) for s in shards]) == [
                [0, 1, 4], [9, 16, 25], [36, 49, 64], [81]]
        assert any(line.startswith("Dask dashboard: http://127.0.0.1:") for line in lines)
        assert cluster.scheduler_address in " ".join(lines)


def test_address_mode_needs_an_address() -> None:
    cfg = {"cluster": "address", "address": None, "workers": None, "host": "127.0.0.1", "dashboard": False}
    with pytest.raises(ValueError, match="dask.address"), dask_client(cfg):
        pass


def _pid(_: object) -> int:
    import os

    return os.getpid()


@pytest.mark.parametrize("in_thread", [True, False])
def test_a_single_local_worker_runs_in_the_jobs_process_unless_told_not_to(in_thread: bool) -> None:
    import os

    cfg = {"cluster": "local", "address": None, "workers": 1, "host": "127.0.0.1", "dashboard": False,
           "single_worker_thread": in_thread}
    environ = dict(os.environ)
    with dask_client(cfg, log=lambda *_: None) as client:
        assert client.scheduler.address.startswith("tcp://127.0.0.1:")
        pids = run_sharded(client, _pid, [[0], [1]])
        # a worker process's nanny sets OMP_NUM_THREADS=1 etc. here to spawn it; they must not stay
        assert dict(os.environ) == environ
    assert (pids == [os.getpid()] * 2) is in_thread


def _as_list(x: int) -> list[int]:
    return [x]


def _fail_on_three(x: int) -> list[int]:
    if x == 3:
        raise ValueError("shard 3 is broken")
    return [x]


def _join(a: list[int], b: list[int]) -> list[int]:
    return a + b


def _half_sum(a: float, b: float) -> float:
    return (a + b) / 2


def test_reduced_results_combine_in_a_fixed_tree_on_the_workers(dask_client_1) -> None:
    """run_reduced folds the shards' results in chains of consecutive shards, then combines the chains pairwise
    (a shape that does not depend on which shard finishes first), returns only the total, and raises a shard's
    error."""
    from asrflow.cluster import run_reduced

    assert run_reduced(dask_client_1, _as_list, list(range(7)), combine=_join) == list(range(7))
    assert run_reduced(dask_client_1, _as_list, [5], combine=_join) == [5]
    # a non-associative combination shows the shape: with a chain per shard, a binary tree ((0,1),(2,3)),((4,5),6)
    tree = _half_sum(_half_sum(_half_sum(0, 1), _half_sum(2, 3)), _half_sum(_half_sum(4, 5), 6))
    assert run_reduced(dask_client_1, float, list(range(7)), combine=_half_sum) == tree
    # three chains of three shards folded in order, then the tree over the chains: ((012),(345)),(6)
    chain = [_half_sum(_half_sum(a, a + 1), a + 2) for a in (0, 3)]
    folded = _half_sum(_half_sum(chain[0], chain[1]), 6.0)
    assert run_reduced(dask_client_1, float, list(range(7)), combine=_half_sum, chains=3) == folded
    assert run_reduced(dask_client_1, _as_list, list(range(7)), combine=_join, chains=3) == list(range(7))
    with pytest.raises(ValueError, match="shard 3 is broken"):
        run_reduced(dask_client_1, _fail_on_three, list(range(5)), combine=_join, retries=0)
    with pytest.raises(ValueError, match="no shards"):
        run_reduced(dask_client_1, _as_list, [], combine=_join)


def _home(_: object) -> str:
    from distributed import get_worker

    return get_worker().address


def _budget(_: object) -> int:
    from asrflow.cluster import cache

    return cache._budget[0]


def test_shards_go_back_to_their_worker_which_caches_within_its_budget() -> None:
    """Shard i runs on the i-th worker (modulo their number) every time, so a worker's cache holds its own
    shards; every worker gets dask.cache_mb as its budget."""
    cfg = {"cluster": "local", "address": None, "workers": 2, "host": "127.0.0.1", "dashboard": False,
           "single_worker_thread": False, "cache_mb": 3}
    with dask_client(cfg, log=lambda *_: None) as client:
        workers = sorted(client.scheduler_info()["workers"])
        first = run_sharded(client, _home, list(range(8)))
        assert first == run_sharded(client, _home, list(range(8))) == [workers[i % 2] for i in range(8)]
        assert run_sharded(client, _budget, [0, 1]) == [3 * 2**20] * 2


def test_a_full_cache_keeps_what_it_holds_and_builds_the_rest_each_time() -> None:
    """Passes that visit the same entries in the same order keep hitting the first ones once the cache is full
    (least-recently-used eviction of such a cycle would never hit)."""
    from asrflow.cluster.cache import Cache, set_budget

    set_budget(100)
    try:
        cache = Cache(share=0.5)  # 50 bytes
        made: list[str] = []

        def value(key: str, nbytes: int) -> tuple[str, int]:
            return cache.get(key, lambda: made.append(key) or (key, nbytes), lambda v: v[1])

        for _ in range(3):  # three passes over a cycle of 60 bytes
            for key in "abc":
                assert value(key, 20) == (key, 20)
        assert made == ["a", "b", "c", "c", "c"] and list(cache) == ["a", "b"] and cache.used == 40
        value("huge", 80)  # larger than the budget: made, not kept
        assert list(cache) == ["a", "b"] and "huge" in made
        cache.pop("a")
        value("c", 20)
        assert list(cache) == ["b", "c"] and cache.used == 40
        cache.clear()
        assert list(cache) == [] and cache.used == 0
    finally:
        set_budget(DEFAULT_BUDGET)


def test_peak_memory_reports_the_driver_and_the_largest_worker(dask_client_1) -> None:
    from asrflow.cluster import peak_memory

    peaks = peak_memory(dask_client_1)
    assert set(peaks) == {"peak_rss_driver_mb", "peak_rss_worker_mb"}
    assert peaks["peak_rss_driver_mb"] > 10 and peaks["peak_rss_worker_mb"] > 10  # a Python process with numpy

    class Unreachable:
        def run(self, *args, **kwargs):
            raise OSError("scheduler gone")

    fallback = peak_memory(Unreachable())  # never a reason to fail a stage
    assert fallback["peak_rss_worker_mb"] == fallback["peak_rss_driver_mb"]


def _child_peak() -> float:
    from asrflow.cluster.client import peak_rss_mb

    return peak_rss_mb()


def test_a_stage_started_by_a_large_process_reports_its_own_peak_not_its_parents() -> None:
    """Linux keeps ru_maxrss across fork and exec: a stage's driver started by Snakemake or by a benchmark
    holding a scheduler would report at least its parent's size."""
    import multiprocessing

    import numpy as np

    ballast = np.ones(300 * 2**20 // 8)  # 300 MB resident in this process
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        child = pool.apply(_child_peak)
    assert ballast.sum() > 0 and child < 200


def test_the_peak_restarts_from_what_the_process_holds_now() -> None:
    """After reset_peak_rss, VmHWM is the work that follows, not an earlier, larger allocation."""
    import numpy as np

    from asrflow.cluster.client import peak_rss_mb, reset_peak_rss

    block = np.ones(40 * 2**20 // 8)  # 40 MB, touched
    before = peak_rss_mb()
    del block
    if not reset_peak_rss():
        pytest.skip("this system cannot restart a process's peak memory (no /proc/self/clear_refs)")
    assert peak_rss_mb() < before - 30


def _square(item: list[int]) -> list[int]:
    return [x * x for x in item]


def test_stream_sharded_keeps_shard_order_and_a_bounded_window(dask_client_1) -> None:
    """Shards are made as the stream asks for them: never more than the window ahead of the results given."""
    from asrflow.cluster import chunks, stream_sharded

    made: list[int] = []

    def source():
        for i in range(23):
            made.append(i)
            yield i

    out = []
    for result in stream_sharded(dask_client_1, _square, chunks(source(), 4), window=2):
        out.append(result)
        assert len(made) <= 4 * (len(out) + 2)  # two shards of four ahead at most
    assert [x for r in out for x in r] == [i * i for i in range(23)] and [len(r) for r in out] == [4] * 5 + [3]
    with pytest.raises(ValueError, match="at least 1"):
        list(chunks([1], 0))


def test_the_feed_gives_each_worker_its_own_shards_a_few_at_a_time() -> None:
    """Each worker gets its own shards in order, two ahead, one more as each finishes; a worker done with its own
    helps one that has more left than it holds ahead, never one that is nearly done."""
    from asrflow.cluster.client import Feed

    home = [["a"] if i % 2 == 0 else ["b"] for i in range(12)]
    feed = Feed(home)
    assert feed.first() == [(0, ["a"]), (1, ["b"]), (2, ["a"]), (3, ["b"])] and feed.left == 8
    assert feed.after(0) == (4, ["a"]) and feed.after(1) == (5, ["b"])
    for done in (2, 4, 6):  # worker a runs ahead: its own until they run out...
        assert feed.after(done) == (done + 4, ["a"])
    assert feed.after(8) == (7, ["a"])  # ...then b's next, b having three left
    assert feed.after(10) is None and feed.left == 2  # b's last two stay with b
    assert feed.after(3) == (9, ["b"]) and feed.after(5) == (11, ["b"]) and feed.after(7) is None
    assert Feed([None] * 3).first() == [(0, None), (1, None)]
    late = Feed([["a"]] * 8)
    assert late.first() == [(0, ["a"]), (1, ["a"])]
    assert late.join(["a", "b"]) == [(2, ["b"]), (3, ["b"])]  # a worker that joins takes the next of a's
    assert late.join(["b"]) == [] and late.after(2) == (4, ["b"]) and late.after(0) == (5, ["a"])


def _slow_home(_: object) -> str:
    import time

    from distributed import get_worker

    time.sleep(0.1)
    return get_worker().address


def test_a_worker_that_joins_late_gets_shards() -> None:
    """A worker that joins while shards are left (a Slurm job that started late) is given its share of those left
    (Dask's stealing alone moved 2 of 60 of the two-ahead shards; fed, the newcomer ran 19)."""
    import threading

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        first = workers_now(client)
        threading.Timer(0.5, lambda: cluster.scale(2)).start()
        ran = run_sharded(client, _slow_home, list(range(80)))
        assert sum(address not in first for address in ran) >= 10, "the worker that joined ran few shards"


def _tasks_here(_: object) -> int:
    """The tasks this worker holds (released ones are being forgotten), after 20 ms of work: shards that take
    time, so that the client's asynchronous release of finished ones keeps up as it does in a stage."""
    from distributed import get_worker

    time.sleep(0.02)
    return sum(task.state != "released" for task in get_worker().state.tasks.values())


def test_a_worker_holds_a_few_shards_to_come_not_its_share_of_the_corpus() -> None:
    """run_reduced and run_sharded submit each worker's shards a few at a time: the tasks a worker knows of stay
    bounded (all at once, each would hold half of the 60 shards' arguments)."""
    from asrflow.cluster import run_reduced

    cfg = {"cluster": "local", "address": None, "workers": 2, "host": "127.0.0.1", "dashboard": False,
           "single_worker_thread": False, "cache_mb": 3}
    with dask_client(cfg, log=lambda *_: None) as client:
        assert run_reduced(client, _tasks_here, list(range(60)), combine=max, chains=2) <= 8
        assert max(run_sharded(client, _tasks_here, list(range(60)))) <= 8


def wait_for(flag: str, blob: bytes) -> int:
    """Block until ``flag`` exists (never, in the test), holding ``blob``."""
    while not os.path.exists(flag):
        time.sleep(0.05)
    return len(blob)


def test_a_lost_worker_is_a_clear_error_of_the_stage(tmp_path: Path, monkeypatch, capsys) -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
        blob = client.scatter(b"model" * 100, workers=[worker])  # as run_reduced scatters the model
        future = client.submit(wait_for, str(tmp_path / "never"), blob, workers=[worker], pure=False)
        time.sleep(0.5)
        with pytest.raises(CommClosedError):
            client.run(os._exit, 1, workers=[worker])  # the worker dies: its connection closes
        with pytest.raises(FutureCancelledError) as lost:
            future.result(timeout=60)
    assert "Dask worker was lost" in lost_worker(lost.value)
    assert lost_worker(ValueError("a bug")) is None

    import asrflow.cli.gmm

    def stage(args):
        raise lost.value

    monkeypatch.setattr(asrflow.cli.gmm, "cmd_gmm", stage)
    from asrflow.cli import main

    assert main(["gmm", "--config", "c.yaml", "--system", "mono", "--train", "train", "--data", "d",
                 "--features", "f", "--lang", "l", "--out", "o"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("asrflow: error: a Dask worker was lost") and "--rerun-incomplete" in err
    monkeypatch.setattr(asrflow.cli.gmm, "cmd_gmm", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # anything else is still a bug's traceback
        main(["gmm", "--config", "c.yaml", "--system", "mono", "--train", "train", "--data", "d",
              "--features", "f", "--lang", "l", "--out", "o"])
