"""Data pipeline for neural training: lazy feature loading, CMVN, targets, length-bucketed batches, and
training examples of a few frames with their context, shuffled across the split.

Features are read utterance by utterance from the ark files through their scp offsets,
so the corpus is never loaded into memory. Batches hold utterances of similar length up
to a frame budget; their order is shuffled with ``seed + epoch``, so every epoch is
reproducible and a resumed run sees the same batches. With ``world_size`` > 1 the order is
cut to a multiple of ``world_size`` so every rank runs the same number of steps (synchronous
all-reduce needs that), and the ranks' batches are balanced step by step: the ``world_size``
batches of one step are of about the same padded size, so no learner waits at an exchange
for another that drew a larger batch.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import kaldiio
import numpy as np
import torch

from asrflow.config.settings import SpecAugment
from asrflow.data.datadir import read_table
from asrflow.features import apply_cmvn, load, read_scp

T = TypeVar("T")


class FeatureDataset(torch.utils.data.Dataset):
    """Per-utterance features of one split (CMVN applied), with optional targets.

    ``targets`` are per-frame labels (``frame_targets=True``, hybrid) or label sequences
    (CTC). Utterances without targets, with frame targets of the wrong length, with an empty
    label sequence, or with more labels than ``frames // subsampling`` (CTC cannot emit
    them) are left out and listed in :attr:`rejected` with the reason. ``utterances``
    restricts the set (e.g. a held-out part of the training split). ``cmvn`` ``utterance``
    normalises each utterance by its own mean instead of its speaker's (``nnet.cmvn``).
    """

    def __init__(self, data_dir: str | Path, feats_dir: str | Path, split: str,
                 targets: dict[str, np.ndarray] | None = None, frame_targets: bool = True,
                 utterances: set[str] | None = None, subsampling: int = 1, cmvn: str = "speaker") -> None:
        feats_dir = Path(feats_dir)
        self.split = split
        scp = read_scp(feats_dir / split / "feats.scp")
        frames = {u: int(n) for u, n in read_table(feats_dir / split / "utt2num_frames").items()}
        utt2spk = read_table(Path(data_dir) / split / "utt2spk")
        if cmvn not in ("speaker", "utterance"):
            raise ValueError(f"cmvn must be speaker or utterance, not {cmvn!r}")
        self.per_utterance = cmvn == "utterance"
        self.cmvn = {} if self.per_utterance else dict(kaldiio.load_scp(str(feats_dir / split / "cmvn.scp")).items())
        self.rejected: dict[str, str] = {}
        self.items: list[tuple[str, str, str, int]] = []
        for utt in sorted(scp):
            if utterances is not None and utt not in utterances:
                continue
            reason = _target_problem(targets, utt, frames[utt], frame_targets, subsampling)
            if reason:
                self.rejected[utt] = reason
                continue
            self.items.append((utt, scp[utt], utt2spk[utt], frames[utt]))
        self.targets = targets
        self.frame_targets = frame_targets

    def __len__(self) -> int:
        return len(self.items)

    def part(self, rank: int, world: int) -> FeatureDataset:
        """Every ``world``-th utterance from ``rank`` (disjoint parts for distributed evaluation)."""
        if world == 1:
            return self
        part = copy.copy(self)
        part.items = self.items[rank::world]
        return part

    @property
    def lengths(self) -> list[int]:
        return [item[3] for item in self.items]

    def __getitem__(self, index: int) -> tuple[str, torch.Tensor, torch.Tensor | None]:
        utt, value, spk, _ = self.items[index]
        feats = torch.from_numpy(apply_cmvn(load(value), None if self.per_utterance else self.cmvn[spk]))
        target = torch.from_numpy(np.asarray(self.targets[utt], dtype=np.int64)) if self.targets is not None else None
        return utt, feats, target


def _target_problem(targets: dict[str, np.ndarray] | None, utt: str, frames: int, frame_targets: bool,
                    subsampling: int) -> str:
    """Why ``utt`` cannot be trained on ("" when it can)."""
    if targets is None:
        return ""
    if utt not in targets:
        return "no alignment" if frame_targets else "no transcript units"
    n = len(targets[utt])
    outputs = (frames + subsampling - 1) // subsampling
    if frame_targets:  # one target per output frame (a chain tree's: one per subsampling frames)
        if n == outputs:
            return ""
        rate = f" ({outputs} output frames)" if subsampling > 1 else ""
        return f"alignment has {n} frames, features {frames}{rate}"
    if n == 0:
        return "empty transcript"
    return "" if n <= outputs else f"{n} units but only {outputs} output frames"


class BucketBatchSampler(torch.utils.data.Sampler):
    """Batches of indices of similar length, at most ``max_frames`` padded frames each."""

    def __init__(self, lengths: list[int], max_frames: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> None:
        self.lengths, self.max_frames, self.seed = lengths, max_frames, seed
        self.rank, self.world_size, self.epoch = rank, world_size, 0
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        self.batches: list[list[int]] = []
        batch: list[int] = []
        for i in order:
            if batch and lengths[i] * (len(batch) + 1) > max_frames:
                self.batches.append(batch)
                batch = []
            batch.append(i)
        if batch:
            self.batches.append(batch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def padded(self, batch: list[int]) -> int:
        """Frames a batch costs once padded to its longest utterance."""
        return len(batch) * max(self.lengths[i] for i in batch)

    def epoch_batches(self, epoch: int | None = None) -> list[list[int]]:
        """This rank's batches for ``epoch`` (default: the current one), in a seed- and epoch-determined order.

        With several ranks, the epoch's batches (a random multiple of ``world_size`` of them)
        are sorted by padded size and dealt out in groups of ``world_size`` neighbours, one to
        each rank, the groups in random order: at every step the ranks' batches cost about
        the same, so the learners of a synchronous or ring exchange reach it together.
        """
        rng = np.random.default_rng([self.seed, self.epoch if epoch is None else epoch])
        order = rng.permutation(len(self.batches))
        if self.world_size == 1:
            return [list(rng.permutation(self.batches[i])) for i in order]
        usable = sorted(order[:len(order) - len(order) % self.world_size],
                        key=lambda i: (self.padded(self.batches[i]), i))
        groups = [usable[g:g + self.world_size] for g in range(0, len(usable), self.world_size)]
        mine = [self.batches[groups[g][self.rank]] for g in rng.permutation(len(groups))]
        return [list(rng.permutation(b)) for b in mine]

    def __iter__(self) -> Iterator[list[int]]:
        return iter([[int(i) for i in b] for b in self.epoch_batches()])

    def __len__(self) -> int:
        return len(self.batches) // self.world_size if self.world_size > 1 else len(self.batches)


class ExampleDataset(torch.utils.data.Dataset):
    """A frame-target dataset cut into training examples: ``frames`` labelled frames each, read with up to
    ``context`` frames of their utterance either side whose targets are ignored (-100).

    A feed-forward network whose outputs depend on ``context`` frames either side (a DNN's
    splicing, a TDNN's receptive field) then computes each labelled frame as it would on the
    whole utterance, while a batch of examples drawn across the split (:class:`ShuffledBatchSampler`)
    mixes many utterances and speakers: Kaldi nnet3's training examples (``frames_per_eg`` with
    the network's left and right context). The last example of an utterance may be shorter.
    """

    def __init__(self, base: FeatureDataset, frames: int, context: int) -> None:
        if frames < 1 or context < 0:
            raise ValueError(f"examples need at least one frame and no negative context, not {frames} and {context}")
        self.base, self.frames, self.context = base, frames, context
        self.rejected = base.rejected
        self.items = [(i, start, min(start + frames, n)) for i, n in enumerate(base.lengths)
                      for start in range(0, n, frames)]

    def __len__(self) -> int:
        return len(self.items)

    @property
    def lengths(self) -> list[int]:
        n = self.base.lengths
        return [min(end + self.context, n[i]) - max(start - self.context, 0) for i, start, end in self.items]

    def __getitem__(self, index: int) -> tuple[str, torch.Tensor, torch.Tensor | None]:
        i, start, end = self.items[index]
        utt, feats, target = self.base[i]
        low, high = max(start - self.context, 0), min(end + self.context, feats.shape[0])
        if target is not None:
            target = target[low:high].clone()
            target[:start - low] = -100
            target[end - low:] = -100
        return utt, feats[low:high], target


class ShuffledBatchSampler(torch.utils.data.Sampler):
    """Batches of equally many items drawn anew every epoch from a seed- and epoch-determined shuffle of
    all of them (for :class:`ExampleDataset`, whose items are of about one length): as many items per batch
    as the longest fits into ``max_frames`` padded frames. With several ranks the epoch's batches are cut
    to a multiple of ``world_size`` and dealt out in turn, so every rank runs the same number of steps."""

    def __init__(self, lengths: list[int], max_frames: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> None:
        self.count, self.seed, self.rank, self.world_size, self.epoch = len(lengths), seed, rank, world_size, 0
        self.per_batch = max(1, max_frames // max(lengths, default=1))
        self.total = -(-self.count // self.per_batch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_batches(self, epoch: int | None = None) -> list[list[int]]:
        """This rank's batches for ``epoch`` (default: the current one)."""
        rng = np.random.default_rng([self.seed, self.epoch if epoch is None else epoch])
        order = rng.permutation(self.count)
        batches = [[int(i) for i in order[b * self.per_batch:(b + 1) * self.per_batch]] for b in range(self.total)]
        if self.world_size == 1:
            return batches
        return batches[self.rank:self.total - self.total % self.world_size:self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.epoch_batches())

    def __len__(self) -> int:
        return self.total // self.world_size


def collate(batch: list[tuple[str, torch.Tensor, torch.Tensor | None]]) -> dict[str, object]:
    """Pad a batch: features (B, T, D), lengths (B,), targets (B, L) padded with -100, target lengths (B,: the
    targets of each that are not -100).

    Features are padded by repeating each utterance's last frame, so a convolution sees
    the same edge in a batch as on the utterance alone. -100 is ignored by frame
    cross-entropy; CTC reads the first ``target_lengths`` labels.
    """
    utts = [b[0] for b in batch]
    lengths = torch.tensor([b[1].shape[0] for b in batch])
    longest = int(lengths.max())
    feats = torch.stack([torch.cat([b[1], b[1][-1:].expand(longest - b[1].shape[0], -1)]) for b in batch])
    out: dict[str, object] = {"utts": utts, "feats": feats, "lengths": lengths}
    if batch[0][2] is not None:
        out["targets"] = torch.nn.utils.rnn.pad_sequence([b[2] for b in batch], batch_first=True, padding_value=-100)
        out["target_lengths"] = (out["targets"] != -100).sum(1)  # labelled frames (an example's context has none)
    return out


def chunk_batch(batch: dict[str, object], size: int) -> dict[str, object]:
    """Cut every utterance of a frame-target batch into chunks of ``size`` frames (the last one shorter).

    Recurrent models then step through ``size`` frames instead of the longest utterance,
    with more sequences side by side (Kaldi's chunk training); padding-only chunks are dropped.
    """
    feats, lengths, targets = batch["feats"], batch["lengths"], batch["targets"]
    b, t, d = feats.shape
    n = -(-t // size)
    pad = n * size - t
    feats = torch.nn.functional.pad(feats, (0, 0, 0, pad)).reshape(b * n, size, d)
    targets = torch.nn.functional.pad(targets, (0, pad), value=-100).reshape(b * n, size)
    starts = torch.arange(n) * size
    chunk_lengths = (lengths.unsqueeze(1) - starts.unsqueeze(0)).clamp(0, size).reshape(-1)
    keep = chunk_lengths > 0
    return {"utts": batch["utts"], "feats": feats[keep], "lengths": chunk_lengths[keep], "targets": targets[keep],
            "target_lengths": chunk_lengths[keep]}


def spec_augment(feats: torch.Tensor, lengths: torch.Tensor, settings: SpecAugment,
                 generator: torch.Generator) -> torch.Tensor:
    """A copy of ``feats`` (B, T, D) with SpecAugment's frequency and time masks (value 0) per utterance.

    With ``freq_warp`` w > 0, each utterance's bins are first stretched by a factor drawn from
    1 ± w (:func:`warp_bins`: vocal-tract-length perturbation on filterbank features).
    ``settings``: ``freq_masks`` bands of up to ``freq_width`` bins and ``time_masks`` spans of
    up to ``time_width`` frames (and at most a fifth of the utterance) each; widths and starts
    come from ``generator``. Padding frames are left alone.
    """
    out = feats.clone()
    dim = feats.shape[2]

    def draw(high: int) -> int:
        return int(torch.randint(0, high + 1, (1,), generator=generator))

    for b, length in enumerate(lengths.tolist()):
        if settings.freq_warp:
            factor = 1.0 + settings.freq_warp * (2 * float(torch.rand(1, generator=generator)) - 1)
            out[b, :length] = warp_bins(out[b, :length], factor)
        for _ in range(settings.freq_masks):
            width = min(draw(settings.freq_width), dim)
            start = draw(dim - width)
            out[b, :length, start:start + width] = 0
        for _ in range(settings.time_masks):
            width = min(draw(settings.time_width), length // 5)
            start = draw(length - width)
            out[b, start:start + width, :] = 0
    return out


def warp_bins(feats: torch.Tensor, factor: float) -> torch.Tensor:
    """Feature bins (T, D) read at ``bin * factor`` by linear interpolation, clamped to the top bin.

    On log-mel filterbanks this moves formants down (factor > 1) or up (< 1), as a longer or
    shorter vocal tract would (VTLP, Jaitly and Hinton 2013).
    """
    dim = feats.shape[1]
    position = (torch.arange(dim, dtype=torch.float64) * factor).clamp(max=dim - 1)
    low = position.floor().long()
    high = (low + 1).clamp(max=dim - 1)
    weight = (position - low).to(feats.dtype)
    return feats[:, low] * (1 - weight) + feats[:, high] * weight


def prefetched(make: Callable[[int], T], indices: Iterable[int], depth: int) -> Iterator[tuple[int, T]]:
    """``(index, make(index))`` in order, with up to ``depth`` items made ahead in a background thread.

    Reading and padding the next batches then overlaps the current step's computation
    (which releases the GIL in torch's kernels, and while waiting for a GPU). ``make`` must
    depend on its index alone, so the result is the same as making each in turn (``depth``
    0 does exactly that). Items not consumed when the caller stops are cancelled; an
    exception raised by ``make`` comes out where its item is consumed.
    """
    if depth <= 0:
        for index in indices:
            yield index, make(index)
        return
    pending: deque[tuple[int, Future]] = deque()
    queue = iter(indices)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="asrflow-prefetch") as pool:
        try:
            for index in queue:
                pending.append((index, pool.submit(make, index)))
                if len(pending) > depth:
                    done, future = pending.popleft()
                    yield done, future.result()
            while pending:
                done, future = pending.popleft()
                yield done, future.result()
        finally:
            for _, future in pending:
                future.cancel()


class _Made(torch.utils.data.Dataset):
    """``(index, make(index))`` for the given indices, as a map-style dataset for DataLoader workers."""

    def __init__(self, make: Callable[[int], T], indices: Iterable[int]) -> None:
        self.make, self.indices = make, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[int, T]:
        index = self.indices[position]
        return index, self.make(index)


def loaded(make: Callable[[int], T], indices: Iterable[int], workers: int, depth: int,
           pin: bool = False) -> Iterator[tuple[int, T]]:
    """``(index, make(index))`` in order, made by ``workers`` processes (torch DataLoader workers, about
    ``depth`` items ahead in all, pinned in the main process when ``pin``), or by :func:`prefetched`'s
    thread when ``workers`` is 0 (``make`` then pins itself). ``make`` must depend on its index alone and
    must not touch a GPU, so any number of workers gives the same items."""
    if workers <= 0:
        yield from prefetched(make, indices, depth)
        return
    # a generator of its own: the loader's worker seeds must not be drawn from the global generator,
    # which draws the training's dropout masks
    loader = torch.utils.data.DataLoader(_Made(make, indices), batch_size=None, shuffle=False, num_workers=workers,
                                         prefetch_factor=max(1, -(-depth // workers)), pin_memory=pin,
                                         generator=torch.Generator().manual_seed(0))
    yield from loader
