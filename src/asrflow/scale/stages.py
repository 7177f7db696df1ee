"""The scale benchmark's stages outside GMM training: each runs the stage's own code at one corpus size.

- ``import``: the data stage (``kaldi_dir`` recipe, every file read and validated on the workers);
- ``features``: the features stage (the trained system's kind, usually MFCC);
- ``lang``: the LM from the size's transcripts and its lang dir, and the system's HCLG;
- ``lang_20k``: the same with a 20,000-word vocabulary (CMUdict words added to the LM's text);
- ``decode``: the fixed test set (:func:`fixed_test`) through the size's HCLG;
- ``tune``: decoder tuning on the size's held-out speakers (at most ``--tune-utterances``, four settings);
- ``score``: that decode scored, with the groups of ``evaluation.groups``;
- ``mlflow``: what the data, features and lang stages log at this size, into a SQLite store.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.data.datadir import read_table
from asrflow.scale.size import Size

VOCABULARY = 20_000  # the large-vocabulary lang's words
TUNE_GRID = {"acoustic_scale": [0.05, 0.1], "insertion_penalty": [0.0, 1.0], "search": "grid"}


def _silent(*_: Any) -> None:
    """A log that writes nothing (the benchmark prints one line per stage)."""


def fixed_test(data_dir: Path, feats_dir: Path, test: str, minutes: float, out: Path) -> dict[str, Any]:
    """Write ``out/data/<test>`` and ``out/features/<test>``: every n-th utterance of ``test`` (n chosen so they hold
    about ``minutes`` of audio, spread over its speakers); their counts."""
    frames = {u: int(n) for u, n in read_table(feats_dir / test / "utt2num_frames").items()}
    utts = sorted(frames)
    step = max(1, round(sum(frames.values()) / (minutes * 6000)))
    chosen = utts[::step]
    utt2spk = read_table(data_dir / test / "utt2spk")
    speakers = sorted({utt2spk[u] for u in chosen})
    tables = {"data": ["text", "utt2spk", "spk2gender", "spk2age"],
              "features": ["feats.scp", "utt2num_frames", "cmvn.scp"]}
    for kind, names in tables.items():
        source = (data_dir if kind == "data" else feats_dir) / test
        folder = out / kind / test
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            if not (source / name).is_file():
                continue
            table = read_table(source / name)
            keys = speakers if name.startswith("spk2") or name == "cmvn.scp" else chosen
            (folder / name).write_text("".join(f"{k} {table[k]}\n" for k in keys if k in table), encoding="utf-8")
    return {"utterances": len(chosen), "minutes": round(sum(frames[u] for u in chosen) / 6000, 1)}


def _import(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.data.stage import prepare_data

    summary = prepare_data(size.stage_config(), size.data, client, log=_silent)
    return {"imported": summary.utterances, "rejected": summary.rejected, "x_real_time": round(summary.x_real_time)}


def _features(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.features.stage import extract_features

    summary = extract_features(size.stage_config(), size.data, size.kind, size.features, client, size.workers,
                               log=_silent)
    return {"frames": summary.frames, "failed": summary.failed, "x_real_time": round(summary.x_real_time)}


def cmudict_words(count: int, seed: int, phones: set[str]) -> list[str]:
    """``count`` words of CMUdict (letters and apostrophes only) that the same acoustic model can pronounce, a
    seeded sample: those whose CMUdict pronunciations use ``phones`` alone (stress marks stripped) or, for a
    grapheme lang (units ``g.<letter>``), those spelled with its letters."""
    from asrflow.lang.lexicon import cmudict_entries

    letters = {p[2:] for p in phones if p.startswith("g.")}

    def fits(word: str, prons: list[list[str]]) -> bool:
        if letters:
            return set(word) <= letters
        return all(p.rstrip("012") in phones for pron in prons for p in pron)

    words = sorted(w for w, prons in cmudict_entries().items() if re.fullmatch(r"[a-z]+", w) and fits(w, prons))
    rng = np.random.default_rng(seed)
    return sorted(words[i] for i in rng.choice(len(words), size=min(count, len(words)), replace=False))


def _lang_and_graph(size: Size, config: dict[str, Any], lang: Path, graph: Path) -> dict[str, Any]:
    """The lang stage and the system's HCLG into ``lang`` and ``graph``; their sizes."""
    from asrflow.decode.stage import make_graph
    from asrflow.lang.stage import prepare_lang

    report = prepare_lang(config, size.data, size.split, [], lang, log=_silent)
    from asrflow.lang.graph import read_symbols

    def real(phones: dict[str, int]) -> dict[str, int]:  # the disambiguation symbols' count may differ
        return {p: i for p, i in phones.items() if not p.startswith("#")}

    if real(read_symbols(lang / "phones.txt")) != real(read_symbols(size.lang_dir / "phones.txt")):
        raise ValueError(f"the phones of {lang} differ from the system's ({size.lang_dir}): its HCLG would not match")
    info = make_graph(lang, size.model_dir, graph, log=_silent)
    return {"words": report["words"], "lm_ngrams": sum(report["lm_ngrams"]),
            "graph_states": info["states"], "graph_mb": round((graph / "HCLG.fst").stat().st_size / 2**20, 1)}


def _lang(size: Size, client: Any) -> dict[str, Any]:
    return _lang_and_graph(size, size.stage_config(), size.root / "lang", size.root / "graph")


def _lang_20k(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.lang.graph import read_symbols

    words, phones = size.root / "cmudict_words.txt", set(read_symbols(size.lang_dir / "phones.txt"))
    words.write_text("".join(f"{w}\n" for w in cmudict_words(VOCABULARY, size.config["seed"], phones)),
                     encoding="utf-8")
    graphemes = any(p.startswith("g.") for p in phones)
    config = size.stage_config(lang={"lm_text": [str(words)], **({"lexicon": "grapheme"} if graphemes else {})})
    return _lang_and_graph(size, config, size.root / "lang_20k", size.root / "graph_20k")


def _decode(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.decode.stage import decode_gmm, write_decode
    from asrflow.gmm.lda import gmm_features
    from asrflow.gmm.shards import split_shards

    assert size.test_root is not None
    config = size.stage_config()
    shards = split_shards(size.test_root / "data", size.test_root / "features", size.root / "lang", size.test,
                          config["decode"]["shard_utts"], **gmm_features(size.model_dir))
    (size.root / "decode").mkdir(exist_ok=True)
    start = time.perf_counter()
    (opts,), per_shard = decode_gmm(config, size.model_dir, size.root / "graph", shards, client, [{}],
                                    desc=f"decode-{size.hours:.0f}h")
    info = write_decode(size.root / "decode", size.test, [r[0] for r in per_shard], time.perf_counter() - start,
                        {"acoustic_scale": opts.acoustic_scale, "beam": opts.beam}, _silent)
    return {"test_utterances": sum(len(s.utts) for s in shards), "rtf": info["rtf"]}


def _tune(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.decode.tune import tune_gmm

    config = size.stage_config()
    config["decode"]["tune"] = {**config["decode"]["tune"], **TUNE_GRID, "max_utterances": size.tune_utterances}
    info = tune_gmm(config, "tri", size.model_dir, size.data, size.features, size.root / "lang", size.split,
                    size.root / "tune", client, log=_silent)
    return {"tuned_utterances": info["utterances"], "settings": len(info["grid"])}


def _score(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.score.stage import score_split

    assert size.test_root is not None
    summary = score_split(size.test_root / "data", size.test, size.root / "decode", size.root / "lang",
                          size.root / "score.json", log=_silent, groups=size.config["evaluation"]["groups"])
    return {"wer": round(summary["wer"], 4)}


def _mlflow(size: Size, client: Any) -> dict[str, Any]:
    """The runs the data, features and lang stages log (metrics, manifests, reports, CMVN statistics), at this size."""
    from asrflow.tracking import stage_run

    config = size.stage_config(tracking={"enabled": True, "uri": f"sqlite:///{size.root / 'mlflow.db'}"})
    artifacts = 0
    for stage, folder in (("data", size.data), ("features", size.features), ("lang", size.root / "lang")):
        with stage_run(config, stage) as run:
            manifest = folder / "manifest.json"
            if manifest.is_file():
                flat = {k: v for k, v in json.loads(manifest.read_text()).items() if isinstance(v, (int, float))}
                run.log_metrics(flat)
            for path in sorted(folder.glob("*")):
                if path.is_file() and path.suffix in (".json", ".tsv", ".txt", ".arpa"):
                    run.log_artifact(path)
                    artifacts += 1
            for split in sorted(p for p in folder.glob("*") if (p / "cmvn.ark").is_file()):
                run.log_artifact(split / "cmvn.ark", f"cmvn/{split.name}")
                artifacts += 1
    return {"artifacts": artifacts}
