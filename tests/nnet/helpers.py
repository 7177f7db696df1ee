"""Helpers of the trainer's tests: generated training data, and killing a run at its first checkpoint.

The data is a data dir and a feature dir of split ``train``: 40-dim features whose frame
class (one of 4, held for 20 frames) is written into the features, so a network learns it
in a few steps; transcripts spell the class sequence. No module here needs more than the
trainer does, so the GPU tests run on a machine with torch and the trainer's packages only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from asrflow.features import cmvn_stats, write_ark
from asrflow.parallel.bench import free_port  # noqa: F401  (the torchrun tests' rendezvous port)

WORDS = ("alpha", "bravo", "charlie", "delta")


def synthetic_split(root: Path, utterances: int = 48, dim: int = 40, seed: int = 0,
                    frames: tuple[int, int] = (60, 160)) -> dict[str, np.ndarray]:
    """Write ``root/data/train`` (utt2spk, text) and ``root/feats`` (ark, scp, CMVN); return the frame classes."""
    rng = np.random.default_rng(seed)
    (root / "data" / "train").mkdir(parents=True)
    (root / "feats" / "train").mkdir(parents=True)
    labels, feats = {}, []
    for i in range(utterances):
        utt = f"spk{i % 3}-utt{i:03d}"
        length = int(rng.integers(frames[0], frames[1] + 1))
        classes = np.repeat(rng.integers(0, 4, size=length // 20 + 1), 20)[:length]
        matrix = rng.standard_normal((length, dim)).astype(np.float32)
        matrix[np.arange(length), classes] += 4.0  # the class is in the features
        labels[utt], feats = classes.astype(np.int64), feats + [(utt, matrix)]
    lines = write_ark(root / "feats" / "feats.ark", feats)
    (root / "feats" / "train" / "feats.scp").write_text("\n".join(lines) + "\n")
    (root / "feats" / "train" / "utt2num_frames").write_text("".join(f"{u} {m.shape[0]}\n" for u, m in feats))
    (root / "data" / "train" / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u, _ in feats))
    (root / "data" / "train" / "text").write_text(
        "".join(f"{u} {' '.join(WORDS[c] for c in collapse(labels[u]))}\n" for u, _ in feats))
    speakers = sorted({u.split("-")[0] for u, _ in feats})
    stats = [(s, sum(cmvn_stats(m) for u, m in feats if u.startswith(s + "-"))) for s in speakers]
    cmvn = write_ark(root / "feats" / "train" / "cmvn.ark", stats)
    (root / "feats" / "train" / "cmvn.scp").write_text("\n".join(cmvn) + "\n")
    return labels


def collapse(classes: np.ndarray) -> list[int]:
    """The class sequence without repeats."""
    return [int(c) for j, c in enumerate(classes) if j == 0 or c != classes[j - 1]]


def kill_at_first_checkpoint(training: subprocess.Popen, ckpt: Path) -> Path:
    """SIGKILL a training process as soon as it has written its first checkpoint ``ckpt``."""
    deadline = time.monotonic() + 120
    while not ckpt.exists() and training.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert training.poll() is None, "training finished before it could be killed"
    os.kill(training.pid, signal.SIGKILL)
    training.wait()
    return ckpt


def read_int_archive(path: str | Path) -> dict[str, np.ndarray]:
    """A Kaldi text archive of integer vectors (``utt 1 2 3``), per utterance."""
    out = {}
    for line in Path(path).read_text().splitlines():
        utt, *values = line.split()
        out[utt] = np.asarray(values, dtype=np.int64)
    return out
