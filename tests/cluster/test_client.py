import pytest
from dask.distributed import LocalCluster

from asrflow.cluster import dask_client, run_sharded, shard


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
    """run_reduced combines the shards' results pairwise in shard order (a tree that does not depend on which
    shard finishes first), returns only the total, and raises a shard's error."""
    from asrflow.cluster import run_reduced

    assert run_reduced(dask_client_1, _as_list, list(range(7)), combine=_join) == list(range(7))
    assert run_reduced(dask_client_1, _as_list, [5], combine=_join) == [5]
    # a non-associative combination shows the tree: ((0,1),(2,3)),((4,5),6)
    tree = _half_sum(_half_sum(_half_sum(0, 1), _half_sum(2, 3)), _half_sum(_half_sum(4, 5), 6))
    assert run_reduced(dask_client_1, float, list(range(7)), combine=_half_sum) == tree
    with pytest.raises(ValueError, match="shard 3 is broken"):
        run_reduced(dask_client_1, _fail_on_three, list(range(5)), combine=_join, retries=0)
    with pytest.raises(ValueError, match="no shards"):
        run_reduced(dask_client_1, _as_list, [], combine=_join)
