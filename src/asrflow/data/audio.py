"""Reading audio for every stage: files (any format libsndfile reads) or Kaldi pipe commands.

Samples are returned as float32 in [-1, 1], first channel only (Kaldi's default), at the
file's own rate; :func:`resample` converts with soxr. WAV headers are checked for
truncation, which libsndfile otherwise hides by returning fewer samples.
"""

from __future__ import annotations

import io
import struct
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf


class AudioError(ValueError):
    """The audio cannot be used; the message says why (for the rejection report)."""


def is_pipe(spec: str) -> bool:
    """True for a Kaldi ``wav.scp`` pipe command such as ``sox a.flac -t wav - |``."""
    return spec.rstrip().endswith("|")


def wav_truncation(path: str | Path) -> str | None:
    """Return a message if a RIFF/WAVE file's data chunk is shorter than its header says."""
    size = Path(path).stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        offset = 12
        while True:
            handle.seek(offset)
            chunk = handle.read(8)
            if len(chunk) < 8:
                return "truncated WAV: no data chunk before the end of the file"
            cid, csize = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            if cid == b"data":
                available = size - offset - 8
                if csize not in (0, 0xFFFFFFFF) and csize > available:
                    return f"truncated WAV: header declares {csize} data bytes, file holds {available}"
                return None
            offset += 8 + csize + (csize & 1)


def _pipe_bytes(command: str) -> bytes:
    proc = subprocess.run(command.rstrip()[:-1], shell=True, capture_output=True, check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise AudioError(f"pipe command failed (exit {proc.returncode}): {err[-1] if err else ''}")
    return proc.stdout


def _read_pcm16_wav(path: str) -> tuple[np.ndarray, int] | None:
    """Fast path for plain 16-bit PCM WAV (most corpora): parse the header, view the samples.

    Returns ``None`` for anything else (the caller then uses libsndfile). The values equal
    libsndfile's float32 output (int16 / 32768).
    """
    with open(path, "rb") as handle:
        blob = handle.read()
    if len(blob) < 44 or blob[:4] != b"RIFF" or blob[8:12] != b"WAVE":
        return None
    offset, fmt = 12, None
    while offset + 8 <= len(blob):
        cid, size = blob[offset : offset + 4], struct.unpack_from("<I", blob, offset + 4)[0]
        body = offset + 8
        if cid == b"fmt " and size >= 16:
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", blob, body)
            if tag == 0xFFFE and size >= 26:  # WAVE_FORMAT_EXTENSIBLE: the sub-format decides
                tag = struct.unpack_from("<H", blob, body + 24)[0]
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            if fmt is None or fmt[0] != 1 or fmt[3] != 16 or fmt[1] < 1:
                return None
            if size in (0, 0xFFFFFFFF) or body + size > len(blob):
                return None  # streamed or truncated: let libsndfile decide
            frames = size // (2 * fmt[1])
            pcm = np.frombuffer(blob, dtype="<i2", count=frames * fmt[1], offset=body)
            return pcm[:: fmt[1]].astype(np.float32) * np.float32(1.0 / 32768.0), fmt[2]
        offset = body + size + (size & 1)
    return None


def read_audio(
    spec: str, start: float | None = None, end: float | None = None
) -> tuple[np.ndarray, int]:
    """Read samples (float32, first channel) and the sample rate; ``start``/``end`` in seconds."""
    if start is None and end is None and not is_pipe(spec):
        try:
            fast = _read_pcm16_wav(spec)
        except OSError as exc:
            raise AudioError(f"cannot read audio: {exc}") from exc
        if fast is not None:
            return fast
    try:
        if is_pipe(spec):
            handle = sf.SoundFile(io.BytesIO(_pipe_bytes(spec)))
        else:
            handle = sf.SoundFile(spec)
        with handle:
            sr = handle.samplerate
            first = int(round((start or 0.0) * sr))
            last = int(round(end * sr)) if end is not None else handle.frames
            if first:
                handle.seek(min(first, handle.frames))
            data = handle.read(max(0, last - first), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        raise AudioError(f"cannot decode audio: {exc}") from exc
    return np.ascontiguousarray(data[:, 0]), sr


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Resample with soxr (high quality); a no-op when the rates match."""
    if rate == target:
        return samples
    import soxr

    return soxr.resample(samples, rate, target, quality="HQ").astype(np.float32, copy=False)
