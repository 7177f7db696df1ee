"""Corpora of a given size made from a real one's audio, as ``asrflow bench scale`` needs them.

Copy ``k`` of a split holds every utterance of it again as a new utterance of a new speaker
(ids ``c<k>-<utt>``, ``c<k>-<speaker>``): copy 0 is the original audio, later copies are played at
speed 0.9, 1.1 or 1.0 in turn (Kaldi's 3-way speed perturbation) and scaled in volume by a seeded
factor in [0.125, 2] (``perturb_data_dir_volume.sh``). Copies are written once, as 16-bit WAV files
in a cache folder, and reused by every size that needs them; a size takes whole copies and the
first utterances of the next until it holds the hours asked for. Each size is a Kaldi data dir
(``wav.scp`` with absolute paths, ``text``, ``utt2spk``, ``spk2gender``/``spk2age`` when the
source has them) that the ``kaldi_dir`` recipe imports.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.data.audio import read_audio
from asrflow.data.datadir import read_data_dir, read_table
from asrflow.data.perturb import perturb_speed
from asrflow.data.validate import Utterance

SPEEDS = (0.9, 1.1, 1.0)  # copy k >= 1 plays at SPEEDS[(k - 1) % 3]
VOLUMES = (0.125, 2.0)  # the range of a copy's volume factor


def copy_factors(k: int, seed: int) -> tuple[float, float]:
    """Speed and volume of copy ``k`` (copy 0: the original)."""
    if k == 0:
        return 1.0, 1.0
    volume = float(np.random.default_rng([seed, k]).uniform(*VOLUMES))
    return SPEEDS[(k - 1) % len(SPEEDS)], round(volume, 4)


def _write_copy(utt: Utterance, path: str, speed: float, volume: float, rate: int) -> None:
    """Write ``utt``'s audio at ``speed`` and ``volume`` as 16-bit PCM at ``rate`` Hz (temporary name, then renamed)."""
    import soundfile as sf

    samples, sr = read_audio(utt.audio, utt.start, utt.end)
    samples = perturb_speed(samples, sr, speed, rate) * volume
    tmp = f"{path}.tmp"
    sf.write(tmp, np.clip(samples, -1.0, 32767 / 32768), rate, subtype="PCM_16", format="WAV")
    os.replace(tmp, path)


def _write_copies(items: list[tuple[Utterance, str]], speed: float, volume: float, rate: int) -> int:
    """Write the copies of ``items`` not on disk yet; how many were written."""
    todo = [(u, p) for u, p in items if not os.path.exists(p)]
    for utt, path in todo:
        _write_copy(utt, path, speed, volume, rate)
    return len(todo)


def sized_corpus(data_dir: str | Path, split: str, hours: float, cache: str | Path, out: str | Path,
                 sample_rate: int, seed: int = 0, workers: int = 2,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the Kaldi data dir ``out/<split>`` of ``hours`` of audio from ``data_dir/<split>`` and its copies
    (audio in ``cache/c<k>/``, written by ``workers`` processes when missing); its counts."""
    source = read_data_dir(Path(data_dir) / split)
    attributes = {name: read_table(Path(data_dir) / split / f"spk2{name}")
                  for name in ("gender", "age") if (Path(data_dir) / split / f"spk2{name}").is_file()}
    target, total, k = hours * 3600.0, 0.0, 0
    rows: list[tuple[str, str, str, str]] = []  # utterance, speaker, audio, text
    while total < target:
        speed, volume = copy_factors(k, seed)
        folder = Path(cache).resolve() / f"c{k}"
        chosen: list[tuple[Utterance, str]] = []
        for utt in source:
            if total >= target:
                break
            path = utt.audio if k == 0 and utt.start is None and utt.end is None else str(folder / f"{utt.utt_id}.wav")
            chosen.append((utt, path))
            total += utt.duration / speed
        if k > 0 or any(p != u.audio for u, p in chosen):
            folder.mkdir(parents=True, exist_ok=True)
            parts = [chosen[i::workers] for i in range(workers)]
            with ProcessPoolExecutor(workers) as pool:
                written = sum(pool.map(_write_copies, parts, [speed] * workers, [volume] * workers,
                                       [sample_rate] * workers))
            if written:
                log(f"copy {k} (speed {speed}, volume {volume}): {written} files written")
        rows += [(f"c{k}-{u.utt_id}", f"c{k}-{u.speaker}", p, u.text) for u, p in chosen]
        k += 1
    folder = Path(out) / split
    folder.mkdir(parents=True, exist_ok=True)
    rows.sort()
    for name, column in (("wav.scp", 2), ("text", 3), ("utt2spk", 1)):
        (folder / name).write_text("".join(f"{r[0]} {r[column]}\n" for r in rows), encoding="utf-8")
    speakers = sorted({r[1] for r in rows})
    for name, table in attributes.items():
        (folder / f"spk2{name}").write_text(
            "".join(f"{s} {table[s.split('-', 1)[1]]}\n" for s in speakers if s.split("-", 1)[1] in table))
    return {"utterances": len(rows), "speakers": len(speakers), "audio_hours": round(total / 3600, 3), "copies": k}
