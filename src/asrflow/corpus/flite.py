"""Synthetic speech from CMU Flite: given sentences, spoken by voices built from real speakers' recordings.

Where eSpeak's formant synthesiser gives many voices of one machine, Flite's English voices are
each made from one person's recordings (the CMU ARCTIC speakers ``awb``, a Scottish man, ``rms``,
an American man, ``slt``, an American woman, by statistical parametric synthesis; ``kal16``, an
American man, by diphone concatenation): fewer voices, closer to real speech. Each voice speaks
at every ``warps`` factor, one speaker per voice x warp: the take is resampled as speed
perturbation does (a factor f raises pitch and every formant by f: a shorter or longer vocal
tract), so five warps of four voices are twenty speakers. Every take draws its duration stretch
(``duration_stretch``) and mean pitch (``int_f0_target_mean``, relative to the voice's own; the
``rms`` voice keeps its own pitch whatever is asked).

Flite pads the word with near-silent pauses; the recipe reads where they end from Flite's
segment timings (``-psdur``) and keeps random margins of them, scales the take to a random peak
and adds faint white noise, as the ``espeak`` recipe does (:mod:`.synth`).

The audio is written once to ``<download_dir>/flite/<digest>/`` (the digest covers the settings
and the Flite version) and reused while the settings are unchanged. Every draw comes from
``seed``. A sentence Flite cannot speak is listed with the problem and rejected in the data
stage's report, never dropped silently.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from asrflow.config.schema import definition_defaults
from asrflow.corpus.base import CorpusError
from asrflow.corpus.synth import Levels, SyntheticSpeech, cut, draw_levels, level, sentences

PROGRAM = "flite"
#: Bumped when what is written for the same settings changes: a new cache folder.
RECIPE_VERSION = 1
#: Flite 2.2's English voices from distinct speakers at 16 kHz (``flite -lv``; ``kal`` is ``kal16`` at 8 kHz).
VOICES = ("awb", "rms", "slt", "kal16")
#: Median F0 (Hz) of each voice at its defaults (flite 2.2, "zero one two three"; an autocorrelation
#: pitch track): the base that ``pitch`` scales. A voice not listed keeps its own pitch.
BASE_F0 = {"awb": 137.0, "rms": 99.0, "slt": 180.0, "kal16": 98.0}
#: Flite's pause segment.
PAUSE = "pau"
_UNSAFE = re.compile(r"[^A-Za-z0-9]+")
_SEGMENT = re.compile(r"(\S+):([0-9.]+)")


@dataclass(frozen=True)
class Settings:
    """What the recipe synthesises (``corpus.flite`` / ``corpus.extra_training[].flite``; the defaults are the
    schema's ``$defs/flite_speech``)."""

    sentences: tuple[str, ...]
    voices: tuple[str, ...]
    warps: tuple[float, ...]
    takes: int
    stretch: tuple[float, float]
    pitch: tuple[float, float]
    seed: int


@dataclass(frozen=True)
class Take:
    """One utterance to synthesise, with every random draw already made."""

    utt_id: str
    speaker: str
    voice: str
    warp: float
    text: str
    stretch: float
    pitch: float
    levels: Levels


def speaker_id(voice: str, warp: float) -> str:
    """``flite_<voice>_w<warp in hundredths>`` (``flite_slt_w094``), the voice's non-alphanumerics removed."""
    return f"flite_{_UNSAFE.sub('', voice)}_w{round(warp * 100):03d}"


def plan(settings: Settings) -> list[Take]:
    """Every take, in a fixed order (voice, warp, sentence, take), drawing from one seeded stream."""
    rng = random.Random(settings.seed)
    takes: list[Take] = []
    for voice in settings.voices:
        for warp in settings.warps:
            speaker = speaker_id(voice, warp)
            for number, text in enumerate(settings.sentences):
                for take in range(settings.takes):
                    takes.append(Take(
                        utt_id=f"{speaker}-{number:04d}_{take}", speaker=speaker, voice=voice, warp=warp,
                        text=text, stretch=rng.uniform(*settings.stretch), pitch=rng.uniform(*settings.pitch),
                        levels=draw_levels(rng, settings.seed * 1_000_003 + len(takes))))
    return takes


def speech_span(segments: str) -> tuple[float, float]:
    """Start and end (seconds) of the speech in Flite's ``-psdur`` line (``pau:0.14 s:0.30 ... s:0.69 pau:0.87``,
    each segment with its end time): from the end of the leading pauses to the end of the last other segment."""
    timed = [(name, float(end)) for name, end in _SEGMENT.findall(segments)]
    spoken = [i for i, (name, _) in enumerate(timed) if name != PAUSE]
    if not spoken:
        raise ValueError("flite spoke no segment but pauses")
    first, last = spoken[0], spoken[-1]
    return (timed[first - 1][1] if first else 0.0), timed[last][1]


def command(take: Take, wav: Path) -> list[str]:
    """The Flite command line that speaks ``take`` into ``wav`` and prints its segment timings."""
    line = [PROGRAM, "-voice", take.voice, "--setf", f"duration_stretch={take.stretch:.4f}"]
    if take.voice in BASE_F0:
        line += ["--setf", f"int_f0_target_mean={BASE_F0[take.voice] * take.pitch:.2f}"]
    return line + ["-psdur", "-t", take.text, "-o", str(wav)]


def finish(signal: np.ndarray, sample_rate: int, span: tuple[float, float], take: Take) -> np.ndarray:
    """The speech within ``span`` (seconds) with the take's margins of Flite's pauses, warped (resampled as
    a speed factor, back at ``sample_rate``), scaled to its peak, plus its background noise."""
    first, end = int(span[0] * sample_rate), min(signal.size, int(np.ceil(span[1] * sample_rate)))
    if end <= first:
        raise ValueError(f"flite's speech span {span[0]:.3f}-{span[1]:.3f} s lies outside its "
                         f"{signal.size / sample_rate:.3f} s of audio")
    speech = cut(signal, sample_rate, first, end, take.levels)
    if take.warp != 1.0:
        from asrflow.data.perturb import perturb_speed  # asrflow.data imports the recipes: import it late

        speech = perturb_speed(speech, sample_rate, take.warp, sample_rate)
    return level(speech, take.levels)


def synthesize(take: Take, path: Path) -> str | None:
    """Speak one take into ``path`` (16-bit PCM at the voice's rate); returns a problem, or ``None``."""
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        raw = Path(scratch) / "flite.wav"
        result = subprocess.run(command(take, raw), capture_output=True, text=True)
        if result.returncode != 0 or not raw.is_file():
            error = result.stderr.strip().splitlines()
            return f"{PROGRAM} -voice {take.voice} failed (exit {result.returncode}): {error[-1] if error else 'no audio'}"
        try:
            signal, sample_rate = sf.read(raw, dtype="float64")
            sf.write(path, finish(signal, sample_rate, speech_span(result.stdout), take), sample_rate,
                     subtype="PCM_16")
        except (ValueError, RuntimeError) as err:
            return f"{PROGRAM} -voice {take.voice}: {err}"
    return None


def flite_version() -> str:
    """Flite's version line; a :class:`CorpusError` naming the package when the program is missing."""
    if shutil.which(PROGRAM) is None:
        raise CorpusError(f"the flite recipe needs the {PROGRAM} program, which is not on PATH "
                          "(Debian/Ubuntu: apt-get install flite; bash workflow/bootstrap.sh installs it as root)")
    out = subprocess.run([PROGRAM, "--version"], capture_output=True, text=True, check=False).stdout
    lines = [line.strip() for line in out.splitlines() if "version" in line]
    return lines[0] if lines else "unknown"


def installed_voices() -> set[str]:
    """The voices Flite was built with (``flite -lv``). Flite speaks an unknown voice in its default one
    without a word, so names are checked against this list first."""
    out = subprocess.run([PROGRAM, "-lv"], capture_output=True, text=True, check=False).stdout
    return set(out.split(":", 1)[-1].split())


def settings_from_config(corpus: dict) -> Settings:
    """:class:`Settings` from a resolved corpus section (its ``flite`` block and ``transcripts`` file)."""
    block = corpus.get("flite") or definition_defaults("flite_speech")
    said = sentences(corpus, block, "flite")
    if corpus["language"] != "en":
        raise CorpusError(f"the flite recipe speaks English only; this corpus's language is {corpus['language']!r}")
    voices = tuple(block["voices"] or VOICES)
    unknown = sorted(set(voices) - installed_voices())
    if unknown:
        raise CorpusError(f"flite.voices: {', '.join(unknown)} not among Flite's voices (flite -lv lists them)")
    return Settings(tuple(said), voices, tuple(float(w) for w in block["warps"]), block["takes"],
                    tuple(block["stretch"]), tuple(block["pitch"]), block["seed"])


class Flite(SyntheticSpeech):
    """Recipe for synthetic speech from Flite's voices."""

    name = "flite"
    recipe_version = RECIPE_VERSION
    program_version = staticmethod(flite_version)
    read_settings = staticmethod(settings_from_config)
    plan = staticmethod(plan)
    speak = staticmethod(synthesize)

    @staticmethod
    def describe(take: Take) -> str:
        return " ".join(command(take, Path(f"{take.utt_id}.wav"))[:-2]) + f" warp={take.warp:g}"
