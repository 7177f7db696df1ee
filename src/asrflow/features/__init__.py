"""The features stage: Kaldi-compatible MFCC / log-mel filterbanks on Dask, ark/scp + CMVN."""

from asrflow.features.ark import iter_scp, load, read_scp, write_ark
from asrflow.features.compute import FeatureOptions, compute, compute_batch
from asrflow.features.transforms import Projection, add_deltas, apply_cmvn, cmvn_stats, splice

__all__ = ["FeatureOptions", "Projection", "add_deltas", "apply_cmvn", "cmvn_stats", "compute", "compute_batch",
           "iter_scp", "load", "read_scp", "splice", "write_ark"]
