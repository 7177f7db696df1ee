"""The espeak recipe: synthetic speakers from eSpeak NG, deterministic, cached, its faults reported."""

from __future__ import annotations

import csv
import random
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrflow.config.schema import ConfigError
from asrflow.corpus import CorpusError, recipe_from_config
from asrflow.corpus import espeak, synth
from asrflow.data import read_data_dir
from asrflow.data.datadir import extra_utterances
from asrflow.data.stage import prepare_data

from ..conftest import make_config, write_wav

needs_espeak = pytest.mark.skipif(shutil.which(espeak.PROGRAM) is None,
                                  reason="espeak-ng is not installed (bash workflow/bootstrap.sh installs it as root)")
SETTINGS = espeak.Settings(sentences=("zero", "six"), voices=("en-us", "en-gb"), variants=("m3", "f2"), takes=2,
                           rate=(110, 200), pitch=(25, 75), seed=0, accents=0)


def _corpus(tmp_path: Path, **block) -> dict:
    sentences = block.pop("sentences", ["zero", "six"])
    return {"name": "espeak", "download_dir": str(tmp_path / "dl"),
            "espeak": {"sentences": sentences, "voices": ["en-us", "en-gb"], "variants": ["m3", "f2"], **block}}


def test_plan_is_deterministic_and_names_speakers() -> None:
    takes = espeak.plan(SETTINGS)
    assert len(takes) == 2 * 2 * 2 * 2
    assert takes == espeak.plan(SETTINGS)
    assert takes != espeak.plan(replace(SETTINGS, seed=1))
    assert takes[0].utt_id == "tts_enus_m3-0000_0" and takes[0].voice == "en-us+m3" and takes[0].text == "zero"
    assert {t.speaker for t in takes} == {"tts_enus_m3", "tts_enus_f2", "tts_engb_m3", "tts_engb_f2"}
    assert len({t.utt_id for t in takes}) == len(takes)
    assert all(t.utt_id.startswith(t.speaker + "-") for t in takes)
    assert all(110 <= t.rate <= 200 and 25 <= t.pitch <= 75 for t in takes)


def test_accented_speakers_follow_the_native_ones() -> None:
    native = espeak.plan(SETTINGS)
    takes = espeak.plan(replace(SETTINGS, accents=2))
    assert takes[:len(native)] == native  # the native voices' draws do not move
    accented = takes[len(native):]
    assert len(accented) == 2 * len(native) and all(t.accent for t in accented)
    assert {t.speaker for t in accented} == {f"tts_{v}_{w}_a{a}" for v in ("enus", "engb") for w in ("m3", "f2")
                                             for a in (1, 2)}
    by_speaker = {t.speaker: t.accent for t in accented}
    assert all(t.accent == by_speaker[t.speaker] for t in accented)  # one accent per speaker
    assert len(set(by_speaker.values())) > 1


def test_accent_draws_respect_the_exclusive_groups() -> None:
    rng = random.Random(5)
    accents = [espeak.draw_accent(rng) for _ in range(200)]
    assert all(a and list(a) == sorted(a) and set(a) <= set(espeak.ACCENT_RULES) for a in accents)
    assert not any({"th_stop", "th_sibilant"} <= set(a) for a in accents)
    assert {name for a in accents for name in a} == set(espeak.ACCENT_RULES)


def test_accent_rules_rewrite_phonemes() -> None:
    said = "z'i@roU s'Iks 'eIt T'In f'aIv h'at"
    assert espeak.apply_accent(said, ("tense_i",)) == "z'i@roU s'i:ks 'eIt T'i:n f'aIv h'at"
    assert espeak.apply_accent(said, ("mono_ei", "no_glides")) == "z'i:roU s'Iks 'Et T'In f'aIv h'at"
    assert espeak.apply_accent(said, ("th_sibilant", "h_drop")) == "z'i@roU s'Iks 'eIt s'In f'aIv 'at"
    # devoicing acts on a word's last phoneme only (stress marks and pauses skipped), not on "z" of "zero"
    assert espeak.apply_accent("z'i@roU f'aIv_: b'Ig", ("devoice",)) == "z'i@roU f'aIf_: b'Ik"
    assert espeak.apply_accent("h", ("h_drop",)) == ""  # a word that loses every phoneme is dropped
    # multi-character mnemonics are one phoneme each: the "I" of "aI" is no lax /ɪ/
    assert espeak.apply_accent("f'aIv OI I@", ("tense_i",)) == "f'aIv OI I@"


def test_finish_trims_digital_silence_and_adds_background() -> None:
    take = espeak.plan(SETTINGS)[0]
    rate = 22050
    signal = np.zeros(rate)
    signal[5000:9000] = 0.2 * np.sin(np.arange(4000) * 0.3)
    out = espeak.finish(signal, rate, take)
    assert out.size <= 4000 + int((synth.LEAD_S[1] + synth.TAIL_S[1]) * rate) + 2
    assert out.size >= 4000
    assert abs(np.abs(out).max() - take.levels.peak) < 0.01
    levels = take.levels
    quiet = out[: int(levels.lead_s * rate)] if levels.lead_s * rate >= 1 else out[-int(levels.tail_s * rate):]
    level = 20 * np.log10(np.sqrt(np.mean(quiet**2)))
    assert abs(level - levels.noise_dbfs) < 3, (level, levels.noise_dbfs)
    with pytest.raises(ValueError, match="only silence"):
        espeak.finish(np.zeros(100), rate, take)


@needs_espeak
def test_recipe_synthesises_once_and_reproducibly(tmp_path: Path) -> None:
    recipe = recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path))["corpus"])
    utts = recipe.list_utterances().utterances
    assert len(utts) == 16 and all(u.problem is None for u in utts)
    first = Path(utts[0].audio)
    audio, rate = sf.read(first)
    assert rate == 22050 and 0.2 < audio.size / rate < 2.0 and np.abs(audio).min() < np.abs(audio).max()
    stamp = first.stat().st_mtime_ns
    assert recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path))["corpus"]).list_utterances() \
        .utterances == utts
    assert first.stat().st_mtime_ns == stamp, "the second listing re-synthesised"
    again = recipe_from_config(make_config(tmp_path, corpus={**_corpus(tmp_path), "download_dir": str(tmp_path / "b")})
                               ["corpus"]).list_utterances().utterances
    assert [Path(u.audio).read_bytes() for u in again] == [Path(u.audio).read_bytes() for u in utts]
    other = recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path, seed=1))["corpus"])
    assert other.root != recipe.root


@needs_espeak
def test_accented_speakers_speak_from_rewritten_phonemes(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path, voices=["en-us"], variants=["m3"], takes=1, accents=1)
    utts = recipe_from_config(make_config(tmp_path, corpus=corpus)["corpus"]).list_utterances().utterances
    assert [u.speaker for u in utts] == ["tts_enus_m3", "tts_enus_m3", "tts_enus_m3_a1", "tts_enus_m3_a1"]
    assert all(u.problem is None for u in utts)
    assert "accent=" not in utts[0].source and "accent=" in utts[2].source
    assert espeak.phonemes("en-us", "six") == "s'Iks"
    for native, accented in zip(utts[:2], utts[2:]):
        assert Path(native.audio).read_bytes() != Path(accented.audio).read_bytes()
        assert 0.2 < sf.info(accented.audio).duration < 2.0


@needs_espeak
def test_faults_are_named(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="espeak.variants: m99"):
        recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path, variants=["m3", "m99"]))["corpus"])
    with pytest.raises(CorpusError, match="espeak.accents rewrites English phonemes; this corpus's language is 'es'"):
        recipe_from_config(make_config(tmp_path, corpus={**_corpus(tmp_path, accents=1), "language": "es"})["corpus"])
    with pytest.raises(CorpusError, match="nothing to say"):
        recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path, sentences=[]))["corpus"])
    listing = recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path, voices=["en-us", "xx-nope"]))
                                 ["corpus"]).list_utterances()
    problems = {u.utt_id: u.problem for u in listing.utterances if u.problem}
    assert len(problems) == 8 and all(u.startswith("tts_xxnope_") for u in problems)
    assert "espeak-ng -v xx-nope+m3 failed" in next(iter(problems.values()))


def test_espeak_block_only_on_an_espeak_corpus(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"corpus.extra_training.0.espeak': only the espeak recipe"):
        make_config(tmp_path, corpus={"name": "yesno", "extra_training": [
            {"name": "asterisk", "espeak": {"sentences": ["six"]}}]})


def test_missing_program_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(espeak, "PROGRAM", "espeak-ng-not-installed")
    with pytest.raises(CorpusError, match="needs the espeak-ng-not-installed program.*apt-get install espeak-ng"):
        recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path))["corpus"])


@needs_espeak
def test_synthetic_speakers_join_training(tmp_path: Path, dask_client_1) -> None:
    own = tmp_path / "own"
    for i, (speaker, word) in enumerate([("ann", "zero"), ("ann", "six"), ("bob", "zero"), ("bob", "six")]):
        write_wav(own / f"{speaker}{i}.wav", 0.5, freq=200 + 40 * i)
    (own / "t.tsv").write_text("".join(f"{s}{i}.wav\t{w}\t{s}\t{'test' if i == 0 else 'train'}\n"
                                       for i, (s, w) in enumerate([("ann", "zero"), ("ann", "six"),
                                                                   ("bob", "zero"), ("bob", "six")])))
    extra = _corpus(tmp_path, voices=["en-us", "xx-nope"])
    config = make_config(tmp_path, corpus={"name": "tsv", "path": str(own), "transcripts": str(own / "t.tsv"),
                                           "extra_training": [extra]}, audio={"sample_rate": 8000})
    prepare_data(config, tmp_path / "data", dask_client_1, log=lambda *_: None)
    train = {u.utt_id for u in read_data_dir(tmp_path / "data" / "train")}
    synthetic = extra_utterances(tmp_path / "data" / "train")
    assert len(synthetic) == 8 and synthetic <= train and all(u.startswith("tts_enus_") for u in synthetic)
    assert not synthetic & {u.utt_id for u in read_data_dir(tmp_path / "data" / "test")}
    with open(tmp_path / "data" / "report.tsv", encoding="utf-8") as handle:
        reasons = [r["reason"] for r in csv.DictReader(handle, delimiter="\t")]
    assert len(reasons) == 8 and all("xx-nope" in r for r in reasons)
