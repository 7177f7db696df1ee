"""The flite recipe: synthetic speakers from CMU Flite's voices at vocal-tract warps, deterministic, cached,
its faults reported."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrflow.config.schema import ConfigError
from asrflow.corpus import CorpusError, flite, recipe_from_config
from asrflow.corpus.synth import Levels

from ..conftest import make_config

needs_flite = pytest.mark.skipif(shutil.which(flite.PROGRAM) is None,
                                 reason="flite is not installed (bash workflow/bootstrap.sh installs it as root)")
SETTINGS = flite.Settings(sentences=("zero", "six"), voices=("slt", "rms"), warps=(0.9, 1.0), takes=2,
                          stretch=(0.85, 1.3), pitch=(0.8, 1.25), seed=0)


def _corpus(tmp_path: Path, **block) -> dict:
    return {"name": "flite", "download_dir": str(tmp_path / "dl"),
            "flite": {"sentences": ["zero", "six"], "voices": ["slt", "rms"], "warps": [0.9, 1.0], **block}}


def test_plan_is_deterministic_and_names_speakers() -> None:
    takes = flite.plan(SETTINGS)
    assert len(takes) == 2 * 2 * 2 * 2 and takes == flite.plan(SETTINGS)
    assert takes != flite.plan(replace(SETTINGS, seed=1))
    assert takes[0].utt_id == "flite_slt_w090-0000_0" and takes[0].voice == "slt" and takes[0].warp == 0.9
    assert {t.speaker for t in takes} == {"flite_slt_w090", "flite_slt_w100", "flite_rms_w090", "flite_rms_w100"}
    assert len({t.utt_id for t in takes}) == len(takes)
    assert all(0.85 <= t.stretch <= 1.3 and 0.8 <= t.pitch <= 1.25 for t in takes)
    assert len({t.levels.noise_seed for t in takes}) == len(takes)


def test_speech_span_skips_the_pauses() -> None:
    assert flite.speech_span("pau:0.136 s:0.299 ih:0.440 k:0.498 s:0.692 pau:0.874 ") == (0.136, 0.692)
    assert flite.speech_span("pau:0.1 pau:0.2 ey:0.4 pau:0.5 t:0.6 pau:0.9") == (0.2, 0.6)
    assert flite.speech_span("ey:0.3 t:0.5") == (0.0, 0.5)
    with pytest.raises(ValueError, match="no segment but pauses"):
        flite.speech_span("pau:0.186 ")


def test_finish_keeps_the_speech_warps_it_and_levels_it() -> None:
    rate = 16000
    signal = np.full(rate, 1e-3)
    signal[4000:8000] = 0.2 * np.sin(np.arange(4000) * 0.3)
    levels = Levels(peak=0.5, noise_dbfs=-60.0, lead_s=0.02, tail_s=0.05, noise_seed=7)
    take = flite.Take("u", "s", "slt", 1.0, "six", 1.0, 1.0, levels)
    out = flite.finish(signal, rate, (0.25, 0.5), take)
    assert out.size == 4000 + int(0.02 * rate) + int(0.05 * rate)
    assert abs(np.abs(out).max() - 0.5) < 0.01
    faster = flite.finish(signal, rate, (0.25, 0.5), replace(take, warp=1.1))
    assert abs(faster.size - out.size / 1.1) <= 2  # a warp above 1 shortens the take as speed perturbation does
    with pytest.raises(ValueError, match="outside its 1.000 s of audio"):
        flite.finish(signal, rate, (1.5, 1.8), take)


@needs_flite
def test_recipe_synthesises_once_and_reproducibly(tmp_path: Path) -> None:
    recipe = recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path))["corpus"])
    utts = recipe.list_utterances().utterances
    assert len(utts) == 16 and all(u.problem is None for u in utts)
    assert utts[0].source.startswith("flite -voice slt --setf duration_stretch=") and "warp=0.9" in utts[0].source
    first = Path(utts[0].audio)
    audio, rate = sf.read(first)
    assert rate == 16000 and 0.15 < audio.size / rate < 1.5
    stamp = first.stat().st_mtime_ns
    assert recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path))["corpus"]).list_utterances() \
        .utterances == utts
    assert first.stat().st_mtime_ns == stamp, "the second listing re-synthesised"
    again = recipe_from_config(make_config(tmp_path, corpus={**_corpus(tmp_path), "download_dir": str(tmp_path / "b")})
                               ["corpus"]).list_utterances().utterances
    assert [Path(u.audio).read_bytes() for u in again] == [Path(u.audio).read_bytes() for u in utts]
    assert recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path, seed=1))["corpus"]).root != recipe.root


@needs_flite
def test_faults_are_named(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="flite.voices: nope not among Flite's voices"):
        recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path, voices=["slt", "nope"]))["corpus"])
    with pytest.raises(CorpusError, match="speaks English only; this corpus's language is 'es'"):
        recipe_from_config(make_config(tmp_path, corpus={**_corpus(tmp_path), "language": "es"})["corpus"])
    with pytest.raises(CorpusError, match="nothing to say"):
        recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path, sentences=[]))["corpus"])
    # punctuation alone: Flite speaks only pauses, and the take is listed with the problem
    listing = recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path, sentences=["six", "..."], voices=["slt"],
                                                                      warps=[1.0], takes=1))["corpus"]).list_utterances()
    problems = {u.utt_id: u.problem for u in listing.utterances if u.problem}
    assert list(problems) == ["flite_slt_w100-0001_0"] and "no segment but pauses" in problems["flite_slt_w100-0001_0"]


def test_flite_block_only_on_a_flite_corpus(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"corpus.flite': only the flite recipe reads it.*did you mean name: flite"):
        make_config(tmp_path, corpus={"name": "espeak", "flite": {"sentences": ["six"]}})


def test_missing_program_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flite, "PROGRAM", "flite-not-installed")
    with pytest.raises(CorpusError, match="needs the flite-not-installed program.*apt-get install flite"):
        recipe_from_config(make_config(tmp_path, corpus=_corpus(tmp_path))["corpus"])
