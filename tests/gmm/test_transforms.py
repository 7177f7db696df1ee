"""fMLLR transforms kept on disk while a split is adapted."""

import pickle
from pathlib import Path

import numpy as np

from asrflow.gmm.adapt import read_transforms, shard_transforms
from asrflow.gmm.transforms import StoredTransforms, TransformRef, matrix


def test_stored_transforms_are_read_back_exactly_and_a_new_estimate_replaces_the_old(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a, b, a2 = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    store = StoredTransforms(tmp_path / "split" / ".transforms")
    store["spk_a"], store["spk_b"] = a, b
    assert len(store) == 2 and "spk_a" in store and "spk_c" not in store
    np.testing.assert_array_equal(store["spk_b"], b)
    store["spk_a"] = a2  # a second pass
    np.testing.assert_array_equal(store["spk_a"], a2)
    ref = pickle.loads(pickle.dumps(store.ref("spk_b")))  # what a task is given
    assert isinstance(ref, TransformRef) and ref.offset > 0
    np.testing.assert_array_equal(matrix(ref), b)
    np.testing.assert_array_equal(matrix(b), b)
    store.remove()
    assert not store.path.exists() and len(store) == 0


def test_a_trans_txt_is_read_into_a_store_and_tasks_get_their_speakers_refs(tmp_path: Path) -> None:
    w = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    (tmp_path / "trans.txt").write_text("s1 " + " ".join(f"{v:.17g}" for v in w.ravel()) + "\n\n")
    store = read_transforms(tmp_path / "trans.txt", into=StoredTransforms(tmp_path / "t"))
    np.testing.assert_array_equal(store["s1"], w)
    assert read_transforms(tmp_path / "trans.txt").keys() == {"s1"}

    class OneShard:
        speakers = ("s1", "s1", "s2")

    given = shard_transforms(OneShard(), store)
    assert list(given) == ["s1"] and isinstance(given["s1"], TransformRef)
    assert isinstance(shard_transforms(OneShard(), {"s1": w})["s1"], np.ndarray)
