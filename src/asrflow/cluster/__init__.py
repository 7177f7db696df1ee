"""Dask clusters for the CPU stages: a LocalCluster by default, or an existing scheduler."""

from asrflow.cluster.client import (
    broadcast,
    chunks,
    dask_client,
    iter_sharded,
    peak_memory,
    run_reduced,
    run_sharded,
    shard,
    stream_sharded,
)

__all__ = ["broadcast", "chunks", "dask_client", "iter_sharded", "peak_memory", "run_reduced", "run_sharded", "shard",
           "stream_sharded"]
