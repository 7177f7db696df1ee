"""Dask clusters for the CPU stages: a LocalCluster by default, or an existing scheduler."""

from asrflow.cluster.client import (
    broadcast,
    dask_client,
    iter_sharded,
    peak_memory,
    run_reduced,
    run_sharded,
    shard,
)

__all__ = ["broadcast", "dask_client", "iter_sharded", "peak_memory", "run_reduced", "run_sharded", "shard"]
