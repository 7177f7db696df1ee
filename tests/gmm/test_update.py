"""Shard statistics summed on the workers: merge_results."""

import numpy as np
from dask.sizeof import sizeof

from asrflow.gmm.alignments import Written
from asrflow.gmm.estep import EStepResult
from asrflow.gmm.update import merge_results


def _result(seed: int, indexes: tuple[str, ...]) -> EStepResult:
    rng = np.random.default_rng(seed)
    return EStepResult(rng.random(50), rng.random((50, 13)), rng.random((50, 13)), rng.random(20), float(seed), 100,
                       Written(indexes), [(f"u{seed}", "no path")], 1, 2.0, 0.5, 90)


def test_two_shards_add_up_and_keep_their_alignment_indexes_in_order() -> None:
    """Statistics and counts add, failures and the written indexes follow shard order; Dask counts a result's
    arrays."""
    left, right = _result(1, ("0.scp",)), _result(2, ("1.scp", "2.scp"))
    total = merge_results(left, right)
    np.testing.assert_array_equal(total.x2, left.x2 + right.x2)
    assert total.frames == 200 and total.aligned_frames == 180 and total.retried == 2
    assert total.alignments == Written(("0.scp", "1.scp", "2.scp"))
    assert total.failed == [("u1", "no path"), ("u2", "no path")]
    assert merge_results(EStepResult(**{**vars(left), "alignments": None}), right).alignments == right.alignments
    arrays = sum(a.nbytes for a in (total.occ, total.x, total.x2, total.trans))
    assert arrays < sizeof(total) < arrays + 1000
