"""The neural data pipeline on real yesno features and tri alignments-shaped targets."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from asrflow.data.stage import prepare_data
from asrflow.features.stage import extract_features
from asrflow.nnet.data import BucketBatchSampler, FeatureDataset, collate

from ..conftest import make_config
from .helpers import read_int_archive


@pytest.fixture(scope="module")
def fbank(tmp_path_factory, mirror, dask_client_1):
    tmp = tmp_path_factory.mktemp("nnet")
    os.environ["ASRFLOW_DATA_MIRROR"] = str(mirror)
    config = make_config(tmp, corpus={"name": "yesno"}, features={"kinds": ["fbank"], "fbank": {"num_mel_bins": 40}})
    prepare_data(config, tmp / "data", dask_client_1, log=lambda *_: None)
    extract_features(config, tmp / "data", "fbank", tmp / "fbank", dask_client_1, log=lambda *_: None)
    return tmp


def test_dataset_applies_cmvn_and_checks_targets(fbank, tmp_path) -> None:
    frames = {line.split()[0]: int(line.split()[1])
              for line in (fbank / "fbank" / "train" / "utt2num_frames").read_text().splitlines()}
    utts = sorted(frames)
    ali = tmp_path / "pdfs.txt"
    lines = [f"{u} {' '.join(['3'] * frames[u])}" for u in utts[:-2]] + [f"{utts[-2]} 1 2 3"]
    ali.write_text("\n".join(lines) + "\n")
    targets = read_int_archive(ali)
    ds = FeatureDataset(fbank / "data", fbank / "fbank", "train", targets)
    assert len(ds) == 29
    assert ds.rejected == {utts[-2]: f"alignment has 3 frames, features {frames[utts[-2]]}", utts[-1]: "no alignment"}
    all_feats = torch.cat([ds[i][1] for i in range(len(ds))])
    assert all_feats.shape[1] == 40 and abs(float(all_feats.mean())) < 0.5  # mean-normalised per speaker


def test_buckets_are_deterministic_per_epoch_and_split_across_ranks() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 500, size=100).tolist()
    sampler = BucketBatchSampler(lengths, max_frames=2000, seed=7)
    again = BucketBatchSampler(lengths, max_frames=2000, seed=7)
    first = list(sampler)
    assert first == list(again)
    assert sorted(i for b in first for i in b) == list(range(100))
    assert all(max(lengths[i] for i in b) * len(b) <= 2000 or len(b) == 1 for b in first)
    sampler.set_epoch(1)
    assert list(sampler) != first
    ranks = [BucketBatchSampler(lengths, 2000, seed=7, rank=r, world_size=3) for r in (0, 1, 2)]
    per_rank = [list(s) for s in ranks]
    assert len({len(b) for b in per_rank}) == 1 == len({len(s) for s in ranks})  # same steps on every rank
    covered = [i for batches in per_rank for b in batches for i in b]
    assert len(covered) == len(set(covered)) and len(covered) >= 100 - max(len(b) for b in first) * 2
    assert per_rank[0] == [[int(i) for i in b] for b in ranks[0].epoch_batches()]


def test_ranks_batches_are_balanced_step_by_step() -> None:
    """At every step the ranks' batches are neighbours by padded size, so nobody waits at the exchange."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(20, 900, size=400).tolist()  # long utterances make batches of uneven cost
    ranks = [BucketBatchSampler(lengths, 2000, seed=3, rank=r, world_size=2) for r in (0, 1)]
    sizes = sorted(ranks[0].padded(b) for b in ranks[0].batches)
    assert sizes[-1] - sizes[0] > 500  # the batches do differ
    per_rank = [[r.padded(b) for b in r.epoch_batches()] for r in ranks]
    gaps = [abs(a - b) for a, b in zip(*per_rank)]
    neighbours = max(b - a for a, b in zip(sizes, sizes[1:]))
    assert max(gaps) <= max(neighbours, 1) * 2 and sum(gaps) < 0.05 * sum(per_rank[0])
    assert per_rank[0] != sorted(per_rank[0])  # the steps are still in random order


def test_collate_pads_targets_with_ignore_index() -> None:
    batch = [("a", torch.ones(3, 2), torch.tensor([1, 2, 3])), ("b", torch.ones(5, 2), torch.tensor([1, 1, 1, 1, 1]))]
    out = collate(batch)
    assert out["feats"].shape == (2, 5, 2) and out["lengths"].tolist() == [3, 5]
    assert out["targets"][0].tolist() == [1, 2, 3, -100, -100]
    batch[0] = ("a", torch.arange(6.0).reshape(3, 2), torch.tensor([1, 2, 3]))
    assert collate(batch)["feats"][0, 3:].tolist() == [[4.0, 5.0], [4.0, 5.0]]  # last frame repeated


def test_chunks_keep_every_frame_and_target() -> None:
    from asrflow.nnet.data import chunk_batch

    feats = torch.arange(2 * 7 * 1, dtype=torch.float32).reshape(2, 7, 1)
    targets = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [7, 8, 9, -100, -100, -100, -100]])
    batch = {"utts": ["a", "b"], "feats": feats, "lengths": torch.tensor([7, 3]), "targets": targets}
    out = chunk_batch(batch, 3)
    assert out["lengths"].tolist() == [3, 3, 1, 3]  # b's padding-only chunks are dropped
    assert out["targets"][out["targets"] != -100].tolist() == list(range(10))
    assert out["feats"][2, 0, 0] == 6 and out["feats"][3, 2, 0] == 9


def test_spec_augment_masks_bands_and_spans_reproducibly() -> None:
    import torch

    from asrflow.config.settings import SpecAugment
    from asrflow.nnet.data import spec_augment

    feats = torch.ones(2, 100, 40)
    lengths = torch.tensor([100, 60])
    settings = SpecAugment(freq_masks=2, freq_width=8, time_masks=2, time_width=20, freq_warp=0.0)
    out = spec_augment(feats, lengths, settings, torch.Generator().manual_seed(3))
    again = spec_augment(feats, lengths, settings, torch.Generator().manual_seed(3))
    assert torch.equal(out, again) and torch.equal(feats, torch.ones(2, 100, 40))  # same draws; input untouched
    masked_bins = (out[0] == 0).all(dim=0).sum()
    masked_frames = (out[0] == 0).all(dim=1).sum()
    assert 0 < masked_bins <= 16 and masked_frames <= 40
    assert (out[1, 60:] == 1).all()  # padding is not masked
    assert (out[1, :60] == 0).all(dim=1).sum() <= 2 * 12  # spans at most a fifth of the utterance
    off = settings.replace(freq_masks=0, time_masks=0)
    assert torch.equal(spec_augment(feats, lengths, off, torch.Generator()), feats)


def test_frequency_warp_stretches_the_bins() -> None:
    import torch

    from asrflow.config.settings import SpecAugment
    from asrflow.nnet.data import spec_augment, warp_bins

    ramp = torch.arange(10.0).repeat(4, 1)
    assert torch.equal(warp_bins(ramp, 1.0), ramp)
    assert torch.allclose(warp_bins(ramp, 0.5)[0], torch.arange(10.0) * 0.5)
    assert torch.allclose(warp_bins(ramp, 2.0)[0], torch.tensor([0.0, 2, 4, 6, 8, 9, 9, 9, 9, 9]))  # clamped at the top
    feats = torch.arange(40.0).repeat(2, 50, 1)
    settings = SpecAugment(freq_masks=0, freq_width=8, time_masks=0, time_width=20, freq_warp=0.2)
    out = spec_augment(feats, torch.tensor([50, 30]), settings, torch.Generator().manual_seed(0))
    factors = out[:, 0, 10] / 10
    assert ((factors > 0.8) & (factors < 1.2)).all() and not torch.allclose(factors[0], factors[1])
    assert torch.equal(out[1, 30:], feats[1, 30:])  # padding untouched


def test_prefetched_items_come_in_order_and_stop_cleanly() -> None:
    from asrflow.nnet.data import prefetched

    made: list[int] = []

    def make(i: int) -> int:
        made.append(i)
        return i * i

    assert list(prefetched(make, range(3, 8), depth=2)) == [(i, i * i) for i in range(3, 8)]
    assert list(prefetched(make, range(3), depth=0)) == [(0, 0), (1, 1), (2, 4)]
    made.clear()
    items = prefetched(make, range(100), depth=2)
    assert next(items) == (0, 0)
    items.close()  # the caller stopped early (early stopping): no more than depth + 1 made
    assert len(made) <= 4

    def broken(i: int) -> int:
        if i == 2:
            raise ValueError("bad batch 2")
        return i

    items = prefetched(broken, range(5), depth=3)
    assert next(items) == (0, 0) and next(items) == (1, 1)
    with pytest.raises(ValueError, match="bad batch 2"):
        next(items)


def test_per_utterance_cmvn_centres_each_utterance_in_datasets_and_shards(fbank) -> None:
    from asrflow.gmm.estep import features
    from asrflow.gmm.shards import split_shards
    from asrflow.lang.stage import prepare_lang

    speaker = FeatureDataset(fbank / "data", fbank / "fbank", "train")
    own = FeatureDataset(fbank / "data", fbank / "fbank", "train", cmvn="utterance")
    assert len(own) == len(speaker) == 31
    for i in (0, 7, 30):
        feats = own[i][1]
        assert float(feats.mean(0).abs().max()) < 1e-3  # every bin's mean 0 within the utterance
        assert not torch.allclose(feats, speaker[i][1])  # the speaker's mean is not the utterance's
    config = make_config(fbank / "cfg", corpus={"name": "yesno"})
    prepare_lang(config, fbank / "data", "train", [], fbank / "lang", log=lambda *_: None)
    by_speaker, by_utt = (split_shards(fbank / "data", fbank / "fbank", fbank / "lang", "train", 16, deltas=0,
                                       cmvn=mode) for mode in ("speaker", "utterance"))
    assert by_utt[0].key != by_speaker[0].key and by_utt[0].cmvn == {} and by_utt[0].per_utterance
    np.testing.assert_allclose(features(by_utt[0])[0], own[0][1].numpy(), atol=1e-5)
    np.testing.assert_allclose(features(by_speaker[0])[0], speaker[0][1].numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="speaker or utterance"):
        FeatureDataset(fbank / "data", fbank / "fbank", "train", cmvn="global")


def _toy_dataset(lengths: list[int]):
    """A FeatureDataset stand-in: utterance ``i`` has frames whose value is their index and targets 100·i + index."""
    class Toy:
        rejected: dict[str, str] = {}

        def __init__(self) -> None:
            self.lengths = lengths

        def __getitem__(self, i: int):
            n = lengths[i]
            return f"u{i}", torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n) + 100 * i

    return Toy()


def test_examples_label_every_frame_once_with_their_utterances_context() -> None:
    from asrflow.nnet.data import ExampleDataset

    examples = ExampleDataset(_toy_dataset([10, 3]), frames=4, context=2)
    assert examples.items == [(0, 0, 4), (0, 4, 8), (0, 8, 10), (1, 0, 3)]
    assert examples.lengths == [6, 8, 4, 3]
    _, feats, target = examples[1]
    assert feats[:, 0].tolist() == list(range(2, 10))  # frames 4-7 with two either side
    assert target.tolist() == [-100, -100, 4, 5, 6, 7, -100, -100]
    labelled = [t for i in range(len(examples)) for t in examples[i][2].tolist() if t != -100]
    assert sorted(labelled) == [*range(10), 100, 101, 102]  # every frame labelled exactly once
    batch = collate([examples[i] for i in range(4)])
    assert batch["target_lengths"].tolist() == [4, 4, 2, 3]  # the labelled frames, not the context
    with pytest.raises(ValueError, match="at least one frame"):
        ExampleDataset(_toy_dataset([5]), frames=0, context=1)


def test_shuffled_batches_mix_the_split_anew_every_epoch_and_split_across_ranks() -> None:
    from asrflow.nnet.data import ShuffledBatchSampler

    lengths = [18] * 95 + [9] * 5
    sampler = ShuffledBatchSampler(lengths, max_frames=180, seed=4)
    first = sampler.epoch_batches(0)
    assert len(first) == len(sampler) == 10 and {len(b) for b in first[:-1]} == {10}
    assert sorted(i for b in first for i in b) == list(range(100))
    assert first == ShuffledBatchSampler(lengths, 180, seed=4).epoch_batches(0)
    second = sampler.epoch_batches(1)
    assert {frozenset(b) for b in second} != {frozenset(b) for b in first}  # new company every epoch
    ranks = [ShuffledBatchSampler(lengths, 180, seed=4, rank=r, world_size=3) for r in range(3)]
    per_rank = [r.epoch_batches(0) for r in ranks]
    assert [len(b) for b in per_rank] == [3, 3, 3] == [len(r) for r in ranks]
    covered = [i for batches in per_rank for b in batches for i in b]
    assert len(covered) == len(set(covered)) == 90
