"""The Kaldi data-dir contract: ``wav.scp``, ``text``, ``utt2spk``, ``spk2utt``, ``utt2dur``,
``segments`` (only when utterances are parts of recordings) and ``utt2sr`` (the source
sample rate, so the features stage knows what to resample), ``utt2speed`` (only when some
utterance is a speed-perturbed copy: its factor, see :mod:`asrflow.data.perturb`) and
``utt2corpus`` (only when some utterances come from ``corpus.extra_training``: for each of them,
the corpus it comes from; the others are the experiment's own corpus's).

Files are sorted in C-locale order (Python string order), one ``key value`` per line, UTF-8.
A ``wav.scp`` value is the rest of its line, so paths with spaces or quotes survive.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from asrflow.data.validate import Utterance

FILES = ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur", "utt2sr")


class DataDirError(ValueError):
    """A data dir is missing a file or its files disagree."""


def _write_table(path: Path, rows: Iterable[tuple[str, str]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as out:
        for key, value in rows:
            out.write(f"{key} {value}\n")
    tmp.replace(path)


def write_data_dir(folder: str | Path, utterances: Iterable[Utterance],
                   speakers: dict[str, dict[str, str]] | None = None) -> None:
    """Write a Kaldi data dir for ``utterances`` (sorted by id); ``speakers`` (attribute → speaker → value, e.g.
    ``gender``) become ``spk2<attribute>`` for the speakers the dir has (a speed-perturbed copy's speaker,
    ``sp<f>-<speaker>``, takes its original's value)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    utts = sorted(utterances, key=lambda u: u.utt_id)
    segmented = any(u.start is not None for u in utts)
    recordings = sorted({u.recording: u.audio for u in utts}.items())
    _write_table(folder / "wav.scp", recordings)
    _write_table(folder / "text", ((u.utt_id, u.text) for u in utts))
    _write_table(folder / "utt2spk", ((u.utt_id, u.speaker) for u in utts))
    spk2utt: dict[str, list[str]] = defaultdict(list)
    for u in utts:
        spk2utt[u.speaker].append(u.utt_id)
    _write_table(folder / "spk2utt", ((s, " ".join(us)) for s, us in sorted(spk2utt.items())))
    _write_speaker_attributes(folder, sorted(spk2utt), speakers or {})
    _write_table(folder / "utt2dur", ((u.utt_id, f"{u.duration:.4f}") for u in utts))
    _write_table(folder / "utt2sr", ((u.utt_id, str(u.sample_rate)) for u in utts))
    if segmented:
        _write_table(
            folder / "segments",
            ((u.utt_id, f"{u.recording} {u.start or 0.0:.3f} {u.end if u.end is not None else -1}")
             for u in utts),
        )
    elif (folder / "segments").exists():
        (folder / "segments").unlink()
    if any(u.speed != 1.0 for u in utts):
        _write_table(folder / "utt2speed", ((u.utt_id, f"{u.speed:g}") for u in utts))
    elif (folder / "utt2speed").exists():
        (folder / "utt2speed").unlink()
    if any(u.corpus for u in utts):
        _write_table(folder / "utt2corpus", ((u.utt_id, u.corpus) for u in utts if u.corpus))
    elif (folder / "utt2corpus").exists():
        (folder / "utt2corpus").unlink()


def _write_speaker_attributes(folder: Path, speakers: list[str], known: dict[str, dict[str, str]]) -> None:
    """``spk2<attribute>`` for each attribute some of ``speakers`` have; a stale one is removed."""
    for attribute, table in known.items():
        rows = [(s, table.get(s, table.get(re.sub(r"^sp[0-9.]+-", "", s)))) for s in speakers]
        rows = [(s, v) for s, v in rows if v is not None]
        if rows:
            _write_table(folder / f"spk2{attribute}", rows)
        elif (folder / f"spk2{attribute}").exists():
            (folder / f"spk2{attribute}").unlink()


def read_table(path: Path) -> dict[str, str]:
    """Read a Kaldi ``key value`` table written by this module."""
    if not path.is_file():
        raise DataDirError(f"{path} is missing")
    table = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(" ")
        if key:
            table[key] = value
    return table


def read_data_dir(folder: str | Path) -> list[Utterance]:
    """Read a data dir written by :func:`write_data_dir` back into utterances."""
    folder = Path(folder)
    wavs = read_table(folder / "wav.scp")
    text = read_table(folder / "text")
    spk = read_table(folder / "utt2spk")
    dur = read_table(folder / "utt2dur")
    rate = read_table(folder / "utt2sr")
    segments = read_table(folder / "segments") if (folder / "segments").is_file() else {}
    speed = read_table(folder / "utt2speed") if (folder / "utt2speed").is_file() else {}
    corpus = read_table(folder / "utt2corpus") if (folder / "utt2corpus").is_file() else {}
    out = []
    for utt in sorted(text):
        if utt not in spk or utt not in dur:
            raise DataDirError(f"{folder}: utterance {utt} is missing from utt2spk or utt2dur")
        if segments:
            rec, start, end = segments[utt].split()
            start_s, end_s = float(start), (None if float(end) < 0 else float(end))
        else:
            rec, start_s, end_s = utt, None, None
        if rec not in wavs:
            raise DataDirError(f"{folder}: recording {rec} of {utt} is missing from wav.scp")
        out.append(Utterance(utt, spk[utt], wavs[rec], text[utt], float(dur[utt]), int(rate[utt]),
                             rec, start_s, end_s, speed=float(speed.get(utt, 1.0)), corpus=corpus.get(utt, "")))
    return out


def extra_utterances(folder: str | Path) -> set[str]:
    """The utterances of data dir ``folder`` that come from ``corpus.extra_training`` corpora (training only:
    kept out of the LM, the held-out utterances and decoder tuning)."""
    path = Path(folder) / "utt2corpus"
    return set(read_table(path)) if path.is_file() else set()


def own_texts(folder: str | Path) -> dict[str, str]:
    """Transcripts of the utterances of ``folder`` that are the experiment's own corpus's."""
    extra = extra_utterances(folder)
    return {u: t for u, t in read_table(Path(folder) / "text").items() if u not in extra}
