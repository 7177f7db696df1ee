"""Recipes on the real mirrored corpora, the generic importers, and downloading."""

from __future__ import annotations

import http.server
import io
import tarfile
import threading
from pathlib import Path

import pytest

from asrflow.corpus import CorpusError, recipe_from_config
from asrflow.corpus.download import DownloadError, Source, fetch
from asrflow.corpus.kaldi_dir import KaldiDir

from ..conftest import make_config, write_wav


def _listing_and_splits(config: dict) -> tuple[list, dict]:
    recipe = recipe_from_config(config["corpus"])
    utts = recipe.list_utterances().utterances
    valid = {u.utt_id: u.speaker for u in utts if u.text is not None and u.problem is None}
    return utts, recipe.splits(valid)


def test_yesno_split(use_mirror: Path, tmp_path: Path) -> None:
    utts, splits = _listing_and_splits(make_config(tmp_path, corpus={"name": "yesno"}))
    assert len(utts) == 60
    assert (len(splits["train"]), len(splits["test"])) == (31, 29)
    first = next(u for u in utts if u.utt_id == "0_0_1_0_1_0_1_1")
    assert first.text == "no no yes no yes no yes yes"


def test_fsdd_standard_and_loso(use_mirror: Path, tmp_path: Path) -> None:
    config = make_config(tmp_path, corpus={"name": "fsdd", "protocols": ["standard", "loso"]})
    utts, splits = _listing_and_splits(config)
    assert len(utts) == 3000
    assert (len(splits["train"]), len(splits["test"])) == (2700, 300)
    folds = sorted(k for k in splits if k.startswith("loso_") and k.endswith("_test"))
    assert len(folds) == 6
    for fold in folds:
        speaker = fold[len("loso_"):-len("_test")]
        assert len(splits[fold]) == 500
        assert not set(splits[fold]) & set(splits[f"loso_{speaker}_train"])
        assert len(splits[f"loso_{speaker}_train"]) == 2500


def test_asterisk_listing(use_mirror: Path, tmp_path: Path) -> None:
    utts, splits = _listing_and_splits(make_config(tmp_path, corpus={"name": "asterisk", "language": "en"}))
    by_id = {u.utt_id: u for u in utts}
    assert by_id["asterisk_en-digits/7"].text == "seven"
    assert len(splits["test"]) == (len(splits["test"]) + len(splits["train"]) + 4) // 5
    ordered = sorted(splits["test"] + splits["train"])
    assert splits["test"] == ordered[::5]


@pytest.mark.parametrize("lang", ["es", "fr"])
def test_asterisk_other_languages(use_mirror: Path, tmp_path: Path, lang: str) -> None:
    utts, splits = _listing_and_splits(make_config(tmp_path, corpus={"name": "asterisk", "language": lang}))
    assert len(utts) > 400 and splits["test"] and splits["train"]


def test_mirror_missing_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRFLOW_DATA_MIRROR", str(tmp_path))
    with pytest.raises(CorpusError, match="has no yesno/waves_yesno/ folder"):
        recipe_from_config(make_config(tmp_path, corpus={"name": "yesno"})["corpus"])


def test_kaldi_dir_import(tmp_path: Path) -> None:
    data = tmp_path / "corpus" / "train"
    data.mkdir(parents=True)
    a = write_wav(tmp_path / "audio" / "rec1.wav", 2.0)
    b = write_wav(tmp_path / "audio" / "my file.wav", 0.5)
    (data / "wav.scp").write_text(f"rec1 {a}\nrec2 {b}\n")
    (data / "segments").write_text("spk1-u1 rec1 0.0 1.0\nspk1-u2 rec1 1.0 -1\nspk2-u3 rec2 0 0.5\n")
    (data / "text").write_text("spk1-u1 hello there\nspk1-u2 general kenobi\nspk2-u3 hi\n")
    (data / "utt2spk").write_text("spk1-u1 spk1\nspk1-u2 spk1\nspk2-u3 spk2\n")
    recipe = KaldiDir(tmp_path / "corpus")
    utts = {u.utt_id: u for u in recipe.list_utterances().utterances}
    assert utts["spk1-u2"].start == 1.0 and utts["spk1-u2"].end is None
    assert utts["spk2-u3"].audio == str(b)
    assert recipe.splits({k: v.speaker for k, v in utts.items()}) == {"train": ["spk1-u1", "spk1-u2", "spk2-u3"]}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _serve(folder: Path):
    handler = lambda *a, **k: _Quiet(*a, directory=str(folder), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_download_verify_and_unpack(tmp_path: Path) -> None:
    """fetch() against a real HTTP server on loopback: checksum verified, layout as a mirror."""
    import hashlib

    served = tmp_path / "served"
    served.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("waves_yesno/0_1_0_1_0_1_0_1.wav", "waves_yesno/README"):
            payload = b"RIFF....WAVE" if name.endswith(".wav") else b"readme"
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    (served / "yesno.tar.gz").write_bytes(buf.getvalue())
    digest = hashlib.sha1(buf.getvalue()).hexdigest()
    (served / "yesno.tar.gz.sha1").write_text(f"{digest}  yesno.tar.gz\n")
    server = _serve(served)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        src = Source(url=f"{base}/yesno.tar.gz", dest="yesno/waves_yesno", strip="waves_yesno",
                     checksum_url=f"{base}/yesno.tar.gz.sha1")
        out = fetch(src, tmp_path / "downloads")
        assert (out / "README").read_bytes() == b"readme"
        bad = Source(url=f"{base}/yesno.tar.gz", dest="x", sha256="0" * 64)
        with pytest.raises(DownloadError, match="sha256 mismatch"):
            fetch(bad, tmp_path / "downloads")
        with pytest.raises(DownloadError, match="cannot download"):
            fetch(Source(url=f"{base}/missing.tar.gz", dest="y"), tmp_path / "downloads")
    finally:
        server.shutdown()
    assert not (tmp_path / "downloads" / "x").exists()


@pytest.mark.parametrize("layout", ["root", "parent", "own"])
def test_kaldi_dir_resolves_relative_wav_paths(tmp_path: Path, layout: str) -> None:
    """Relative wav.scp paths are found against the data dir's parent (speechocean762: <root>/WAVE/... with
    <root>/train/wav.scp), corpus.path, or the data dir itself; never against the working directory."""
    root = tmp_path / "corpus"
    data = root / "train"
    data.mkdir(parents=True)
    where = {"root": root, "parent": root, "own": data}[layout]
    write_wav(where / "WAVE" / "SPEAKER0001" / "000010011.WAV", 0.5)
    (data / "wav.scp").write_text("u1 WAVE/SPEAKER0001/000010011.WAV\nu2 WAVE/SPEAKER0001/missing.WAV\n")
    (data / "text").write_text("u1 hello\nu2 there\n")
    (data / "utt2spk").write_text("u1 s1\nu2 s1\n")
    recipe = KaldiDir(data if layout == "parent" else root)  # one data dir, or the folder of the splits
    utts = {u.utt_id: u for u in recipe.list_utterances().utterances}
    assert utts["u1"].audio == str((where / "WAVE" / "SPEAKER0001" / "000010011.WAV").resolve())
    assert utts["u2"].audio == str((root / "WAVE" / "SPEAKER0001" / "missing.WAV").resolve())  # named, not lost


def test_kaldi_dir_keeps_absolute_paths_and_pipes(tmp_path: Path) -> None:
    data = tmp_path / "train"
    data.mkdir()
    wav = write_wav(tmp_path / "a.wav", 0.5)
    (data / "wav.scp").write_text(f"u1 {wav}\nu2 sox x.wav -t wav - |\n")
    (data / "text").write_text("u1 a\nu2 b\n")
    utts = {u.utt_id: u for u in KaldiDir(data).list_utterances().utterances}
    assert utts["u1"].audio == str(wav) and utts["u2"].audio == "sox x.wav -t wav - |"


def test_speechocean762_keeps_its_split_speakers_and_lexicon(use_mirror: Path, tmp_path: Path) -> None:
    """The mirror's 12-speaker slice, laid out as the full corpus: its own train/test split, root-relative
    wav.scp paths found, speakers' age and gender kept, its lexicon located."""
    mini = str(use_mirror / "speechocean762-mini")
    config = make_config(tmp_path, corpus={"name": "speechocean762", "path": mini}, audio={"sample_rate": 16000})
    recipe = recipe_from_config(config["corpus"])
    listing = recipe.list_utterances()
    utts = {u.utt_id: u for u in listing.utterances}
    assert len(utts) == 240 and not [u for u in utts.values() if u.problem]
    assert all(Path(u.audio).is_file() for u in utts.values())
    splits = recipe.splits({k: v.speaker for k, v in utts.items()})
    assert {utts[u].speaker for u in splits["train"]} == {"0001", "0005", "0006", "0036", "0135", "0482"}
    assert {utts[u].speaker for u in splits["test"]} == {"0003", "0049", "0092", "0024", "0461", "0765"}
    assert listing.speakers["age"]["0001"] == "6" and listing.speakers["gender"]["0006"] == "f"
    assert len(listing.speakers["gender"]) == 12 and recipe.lexicon.is_file()
    (tmp_path / "broken" / "train").mkdir(parents=True)
    with pytest.raises(CorpusError, match="not a speechocean762 copy: no train/wav.scp, test/wav.scp"):
        recipe_from_config({**config["corpus"], "path": str(tmp_path / "broken")}).list_utterances()
