"""Validate utterances: every fault is a reported rejection, never a crash or a silent loss.

Checks, with the reason each writes to the report:

* listing faults found by the recipe (non-UTF-8 transcript line, unparsable name, ...);
* duplicate utterance id (the first one listed is kept; found by the data stage once the valid
  utterances are sorted);
* no transcript; transcript empty after normalisation;
* audio: missing file, empty file, not decodable, truncated WAV, no samples, unreadable
  sample rate, duration outside ``[audio.min_duration, audio.max_duration]``, segment
  outside the recording.

Audio checks are pure functions of one utterance, so the data stage runs them as Dask tasks
over shards; text checks run on the driver as the recipe lists the utterances.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from asrflow.corpus.base import RawUtterance
from asrflow.data.audio import AudioError, is_pipe, read_audio, wav_truncation
from asrflow.text import normalize_text


@dataclass(frozen=True)
class Utterance:
    """A validated utterance, as written to a Kaldi data dir."""

    utt_id: str
    speaker: str
    audio: str
    text: str
    duration: float
    sample_rate: int
    recording: str
    start: float | None = None
    end: float | None = None
    checksum: str = ""
    speed: float = 1.0  # a speed-perturbed copy plays the audio this many times as fast (asrflow.data.perturb)
    corpus: str = ""  # the corpus.extra_training corpus it comes from ("": the experiment's own corpus)


@dataclass(frozen=True)
class Rejection:
    """An utterance (or file) left out, and why."""

    utt_id: str
    file: str
    reason: str


@dataclass(frozen=True)
class AudioCheck:
    """Result of checking one utterance's audio (picklable: runs on Dask workers)."""

    utt_id: str
    ok: bool
    reason: str = ""
    duration: float = 0.0
    sample_rate: int = 0
    checksum: str = ""


def check_audio(raw: RawUtterance, min_duration: float, max_duration: float) -> AudioCheck:
    """Decode one utterance's audio fully and check it; never raises."""
    utt = raw.utt_id
    try:
        if not is_pipe(raw.audio):
            path = Path(raw.audio)
            if not path.is_file():
                return AudioCheck(utt, False, "audio file not found")
            if path.stat().st_size == 0:
                return AudioCheck(utt, False, "audio file is empty (0 bytes)")
            truncated = wav_truncation(path)
            if truncated:
                return AudioCheck(utt, False, truncated)
            checksum = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            checksum = hashlib.sha256(raw.audio.encode()).hexdigest()
        samples, rate = read_audio(raw.audio, raw.start, raw.end)
    except AudioError as exc:
        return AudioCheck(utt, False, str(exc))
    except OSError as exc:
        return AudioCheck(utt, False, f"cannot read audio: {exc}")
    if rate <= 0:
        return AudioCheck(utt, False, f"unreadable sample rate {rate}")
    if samples.size == 0:
        if raw.start is not None:
            return AudioCheck(utt, False, f"segment {raw.start}-{raw.end} s lies outside the recording")
        return AudioCheck(utt, False, "audio has no samples")
    duration = samples.size / rate
    if raw.end is not None and raw.start is not None and duration + 1.0 / rate < raw.end - raw.start - 0.01:
        return AudioCheck(utt, False, f"segment end {raw.end} s is past the end of the recording")
    if duration < min_duration:
        return AudioCheck(utt, False, f"duration {duration:.3f} s is below audio.min_duration {min_duration} s")
    if duration > max_duration:
        return AudioCheck(utt, False, f"duration {duration:.3f} s is above audio.max_duration {max_duration} s")
    return AudioCheck(utt, True, duration=duration, sample_rate=rate, checksum=checksum)


def text_problem(raw: RawUtterance, lang: str) -> tuple[str | None, str]:
    """``raw``'s normalised transcript, or None and why it is rejected (a listing fault, a bad id, no transcript,
    or nothing left after normalisation)."""
    if raw.problem:
        return None, raw.problem
    if any(ch.isspace() for ch in raw.utt_id) or not raw.utt_id:
        return None, "utterance id is empty or has whitespace"
    if raw.text is None:
        return None, "no transcript"
    text = normalize_text(raw.text, lang)
    if not text:
        return None, f"transcript empty after normalisation: {raw.text!r}"
    return text, ""


def validate_batch(items: list[tuple[RawUtterance, str]], min_duration: float, max_duration: float,
                   corpus: str = "") -> list[tuple[Utterance, str | None] | Rejection]:
    """Check the audio of a shard of ``(utterance, normalised transcript)`` (one Dask task): each becomes a valid
    :class:`Utterance` (with the split its recipe gave it) or a :class:`Rejection`."""
    out: list[tuple[Utterance, str | None] | Rejection] = []
    for raw, text in items:
        check = check_audio(raw, min_duration, max_duration)
        if not check.ok:
            out.append(Rejection(raw.utt_id, raw.audio, check.reason))
            continue
        out.append((Utterance(raw.utt_id, raw.speaker, raw.audio, text, check.duration, check.sample_rate,
                              raw.recording_id, raw.start, raw.end, check.checksum, corpus=corpus), raw.split))
    return out
