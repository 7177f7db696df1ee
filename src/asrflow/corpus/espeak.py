"""Synthetic speech from eSpeak NG: given sentences, each spoken by many synthetic voices.

Text-to-speech augmentation for small corpora: the formant synthesiser speaks every sentence
in every ``voice`` × ``variant`` (a regional accent × a voice quality: formants, pitch range,
breathiness), each of ``takes`` times at a random rate and pitch. Each voice × variant is
one speaker, so CMVN and fMLLR treat it as one. As ``corpus.extra_training`` it adds speakers
to every training split (FSDD's digits: ``config/experiments/fsdd_tts.yaml``).

eSpeak writes digital silence (exact zeros) around the word; the recipe trims it to a random
margin and adds faint white noise (the background of real recordings, about −55 dBFS in FSDD)
so that no frame is all zeros, and scales each utterance to a random peak level (:mod:`.synth`,
shared with the ``flite`` recipe).

With ``accents`` > 0 every voice x variant also speaks as that many non-native speakers: the
sentence's English phonemes (``espeak-ng -x``) are rewritten by a few of the phonological processes
that learners of English commonly carry over from their first language (:data:`ACCENT_RULES`:
/ɪ/ said as /iː/, monophthongs for /eɪ/ and /oʊ/, stops or sibilants for "th", dropped /h/,
devoiced final consonants, ...), each rule drawn once per speaker so that a speaker's accent is
consistent, and spoken from the phonemes (``[[...]]``).

The audio is written once to ``<download_dir>/espeak/<digest>/`` (the digest covers the
settings and the eSpeak version) and reused while the settings are unchanged. Everything
drawn at random comes from ``seed``: the same settings and eSpeak build give the same files.
A sentence that eSpeak cannot speak (an unknown voice, a crash) is listed with the problem
and rejected in the data stage's report, never dropped silently.
"""

from __future__ import annotations

import io
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from asrflow.config.schema import definition_defaults
from asrflow.corpus.base import CorpusError
from asrflow.corpus.synth import Levels, SyntheticSpeech, cut, draw_levels, level, sentences

PROGRAM = "espeak-ng"
#: Bumped when what is written for the same settings changes (trimming, levels, noise): a new cache folder.
RECIPE_VERSION = 1
#: Regional English voices of eSpeak NG 1.51 (``espeak-ng --voices=en``, the formant ones).
ENGLISH_ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd",
                   "en-029", "en-us-nyc")
#: Voice-quality variants (``espeak-ng-data/voices/!v``): seven male, five female, one Klatt.
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5", "klatt")
#: Digital silence below this (of full scale) is trimmed.
SILENCE = 1e-4
_UNSAFE = re.compile(r"[^A-Za-z0-9]+")
#: eSpeak NG's English phoneme mnemonics of more than one character (``espeak-ng -x``), longest first;
#: every other character is a phoneme, a stress mark or a pause on its own.
_MULTI = ("aI@", "aU@", "i@3", "aI2", "eI", "aI", "OI", "oU", "aU", "I@", "e@", "U@", "o@", "i@", "O@", "A@",
          "3:", "i:", "u:", "A:", "O:", "@2", "@5", "@L", "a#", "I2", "I#", "E2", "IR", "VR", "0#", "t[", "_:")
_TOKEN = re.compile("|".join(re.escape(m) for m in _MULTI) + "|.", re.DOTALL)
#: Stress marks and pauses: not phonemes (skipped when finding a word's last phoneme).
_MARKS = {"'", ",", "%", "=", "_", "_:", "-"}
#: Non-native processes as token rewrites (eSpeak English mnemonics); a ``^`` key acts on a word's
#: last phoneme only. Each accented speaker gets each rule with probability one half, and at most
#: one of the rules of each group in :data:`ACCENT_GROUPS`.
ACCENT_RULES: dict[str, dict[str, str]] = {
    "tense_i": {"I": "i:", "I2": "i:"},           # lax /ɪ/ as tense /iː/: "six" as "seeks"
    "tense_u": {"U": "u:"},                       # /ʊ/ as /uː/
    "mono_ei": {"eI": "E"},                       # /eɪ/ as a monophthong: "eight" as "ett"
    "mono_ou": {"oU": "O:"},                      # /oʊ/ as a monophthong: "zero" ending in /ɔ/
    "open_v": {"V": "a"},                         # /ʌ/ as /a/: "one" as "wan"
    "raise_ae": {"a": "E"},                       # /æ/ as /ɛ/
    "th_stop": {"T": "t", "D": "d"},              # "three" as "tree"
    "th_sibilant": {"T": "s", "D": "z"},          # "three" as "sree"
    "h_drop": {"h": ""},                          # no /h/
    "full_vowels": {"@": "E", "@2": "E", "a#": "a"},  # no reduced vowels: "seven" as "sev-en"
    "no_glides": {"i@": "i:", "i@3": "i:", "o@": "O:", "O@": "O:", "e@": "E"},  # "zero" as "zee-ro"
    "devoice": {"^z": "s", "^v": "f", "^d": "t", "^b": "p", "^g": "k"},  # final obstruents devoiced: "five" as "fife"
    "w_as_v": {"w": "v"},                         # /w/ as /v/: "one" as "von"
}
#: Rules that exclude each other (a speaker has at most one of each group).
ACCENT_GROUPS = (("th_stop", "th_sibilant"),)


@dataclass(frozen=True)
class Settings:
    """What the recipe synthesises (``corpus.espeak`` / ``corpus.extra_training[].espeak``; the defaults
    are the schema's ``$defs/espeak_speech``)."""

    sentences: tuple[str, ...]
    voices: tuple[str, ...]
    variants: tuple[str, ...]
    takes: int
    rate: tuple[int, int]
    pitch: tuple[int, int]
    seed: int
    accents: int


@dataclass(frozen=True)
class Take:
    """One utterance to synthesise, with every random draw already made."""

    utt_id: str
    speaker: str
    voice: str
    text: str
    rate: int
    pitch: int
    levels: Levels
    accent: tuple[str, ...]


def speaker_id(voice: str, variant: str, accent: int = 0) -> str:
    """``tts_<voice>_<variant>`` (``_a<accent>`` for a non-native one) with everything but letters and
    digits removed from each part."""
    base = f"tts_{_UNSAFE.sub('', voice)}_{_UNSAFE.sub('', variant)}"
    return f"{base}_a{accent}" if accent else base


def draw_accent(rng: random.Random) -> tuple[str, ...]:
    """One speaker's accent: each rule of :data:`ACCENT_RULES` with probability one half, one rule at
    most from each exclusive group, at least one rule; sorted names."""
    while True:
        chosen = {name for name in ACCENT_RULES if rng.random() < 0.5}
        for group in ACCENT_GROUPS:
            present = sorted(chosen & set(group))
            chosen -= set(present[1:] if rng.random() < 0.5 else present[:-1])
        if chosen:
            return tuple(sorted(chosen))


def apply_accent(phonemes: str, accent: tuple[str, ...]) -> str:
    """``phonemes`` (eSpeak mnemonics, words separated by spaces) rewritten by the accent's rules."""
    plain = {k: v for name in accent for k, v in ACCENT_RULES[name].items() if not k.startswith("^")}
    final = {k[1:]: v for name in accent for k, v in ACCENT_RULES[name].items() if k.startswith("^")}
    words = []
    for word in phonemes.split():
        tokens = _TOKEN.findall(word)
        last = max((i for i, t in enumerate(tokens) if t not in _MARKS), default=-1)
        words.append("".join(final.get(t, plain.get(t, t)) if i == last else plain.get(t, t)
                             for i, t in enumerate(tokens)))
    return " ".join(w for w in words if w)


def plan(settings: Settings) -> list[Take]:
    """Every take, in a fixed order (voice, variant, sentence, take; then the accented speakers in the same
    order), drawing from one seeded stream."""
    rng = random.Random(settings.seed)
    takes: list[Take] = []
    speakers = [(voice, variant, 0) for voice in settings.voices for variant in settings.variants]
    speakers += [(voice, variant, a) for voice in settings.voices for variant in settings.variants
                 for a in range(1, settings.accents + 1)]
    for voice, variant, accent in speakers:
        speaker = speaker_id(voice, variant, accent)
        rules = draw_accent(rng) if accent else ()
        for number, text in enumerate(settings.sentences):
            for take in range(settings.takes):
                takes.append(Take(
                    utt_id=f"{speaker}-{number:04d}_{take}", speaker=speaker, voice=f"{voice}+{variant}",
                    text=text, rate=rng.randint(*settings.rate), pitch=rng.randint(*settings.pitch),
                    levels=draw_levels(rng, settings.seed * 1_000_003 + len(takes)), accent=rules))
    return takes


def finish(signal: np.ndarray, sample_rate: int, take: Take) -> np.ndarray:
    """Trim digital silence to the take's margins, scale to its peak, add its background noise."""
    loud = np.flatnonzero(np.abs(signal) > SILENCE)
    if loud.size == 0:
        raise ValueError("eSpeak produced only silence")
    return level(cut(signal, sample_rate, int(loud[0]), int(loud[-1]) + 1, take.levels), take.levels)


def phonemes(voice: str, text: str) -> str:
    """What eSpeak says for ``text`` in ``voice`` (its ``-x`` mnemonics, one line); a ``ValueError`` if it fails."""
    result = subprocess.run([PROGRAM, "-q", "-x", "-v", voice, text], capture_output=True, text=True)
    said = " ".join(result.stdout.split())
    if result.returncode != 0 or not said:
        error = result.stderr.strip().splitlines()
        raise ValueError(f"{PROGRAM} -x -v {voice} failed (exit {result.returncode}): "
                         f"{error[-1] if error else 'no phonemes'}")
    return said


def synthesize(take: Take, path: Path) -> str | None:
    """Speak one take into ``path`` (16-bit PCM at eSpeak's rate); returns a problem, or ``None``."""
    said = take.text
    if take.accent:
        try:
            said = f"[[{apply_accent(phonemes(take.voice, take.text), take.accent)}]]"
        except ValueError as err:
            return str(err)
    command = [PROGRAM, "-v", take.voice, "-s", str(take.rate), "-p", str(take.pitch), "--stdout", said]
    result = subprocess.run(command, capture_output=True)
    if result.returncode != 0 or not result.stdout:
        error = result.stderr.decode(errors="replace").strip().splitlines()
        return f"{PROGRAM} -v {take.voice} failed (exit {result.returncode}): {error[-1] if error else 'no audio'}"
    try:
        signal, sample_rate = sf.read(io.BytesIO(result.stdout), dtype="float64")
        sf.write(path, finish(signal, sample_rate, take), sample_rate, subtype="PCM_16")
    except (ValueError, RuntimeError) as err:
        return f"{PROGRAM} -v {take.voice}: {err}"
    return None


def espeak_version() -> str:
    """``espeak-ng --version``'s first line; a :class:`CorpusError` naming the package when it is missing."""
    if shutil.which(PROGRAM) is None:
        raise CorpusError(f"the espeak recipe needs the {PROGRAM} program, which is not on PATH "
                          "(Debian/Ubuntu: apt-get install espeak-ng; bash workflow/bootstrap.sh installs it as root)")
    out = subprocess.run([PROGRAM, "--version"], capture_output=True, text=True, check=False).stdout
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def installed_variants() -> set[str]:
    """The variant names eSpeak NG knows (the ``!v/<name>`` files of ``espeak-ng --voices=variant``)."""
    out = subprocess.run([PROGRAM, "--voices=variant"], capture_output=True, text=True, check=False).stdout
    return {field.split("/", 1)[1] for line in out.splitlines() for field in line.split() if field.startswith("!v/")}


def settings_from_config(corpus: dict) -> Settings:
    """:class:`Settings` from a resolved corpus section (its ``espeak`` block and ``transcripts`` file)."""
    block = corpus.get("espeak") or definition_defaults("espeak_speech")
    said = sentences(corpus, block, "espeak")
    variants = tuple(block["variants"] or VARIANTS)
    unknown = sorted(set(variants) - installed_variants())
    if unknown:
        raise CorpusError(f"espeak.variants: {', '.join(unknown)} not among eSpeak NG's variants "
                          f"(espeak-ng --voices=variant lists them)")
    if block["accents"] and corpus["language"] != "en":
        raise CorpusError(f"espeak.accents rewrites English phonemes; this corpus's language is "
                          f"{corpus['language']!r} (set accents: 0)")
    voices = block["voices"] or (ENGLISH_ACCENTS if corpus["language"] == "en" else (corpus["language"],))
    return Settings(tuple(said), tuple(voices), variants, block["takes"],
                    tuple(block["rate"]), tuple(block["pitch"]), block["seed"], block["accents"])


class Espeak(SyntheticSpeech):
    """Recipe for synthetic speech from eSpeak NG."""

    name = "espeak"
    recipe_version = RECIPE_VERSION
    program_version = staticmethod(espeak_version)
    read_settings = staticmethod(settings_from_config)
    plan = staticmethod(plan)
    speak = staticmethod(synthesize)

    @staticmethod
    def describe(take: Take) -> str:
        return (f"{PROGRAM} -v {take.voice} -s {take.rate} -p {take.pitch}"
                + (f" accent={'+'.join(take.accent)}" if take.accent else ""))
