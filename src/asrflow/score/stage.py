"""The score stage: WER summary JSON and per-utterance alignments for one system and test set.

Besides the WER over the whole test set, the summary splits it by what the decoder's LM knew: utterances
whose words are all in its vocabulary (``wer_in_vocabulary``) and utterances whose sentence is one of the
training transcripts the LM was estimated from (``sentences``: ``seen`` and ``new``). Read speech often
repeats prompts across speakers; the WER on seen sentences is what the acoustic model makes when the LM
has memorised the text, so the gap to new sentences is the LM's share of the errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asrflow.data.datadir import own_texts, read_table
from asrflow.data.groups import speaker_groups
from asrflow.lang.arpa import arpa_words
from asrflow.score.wer import format_alignment, group_summaries, score_corpus

NON_WORDS = {"<eps>", "<SIL>", "#0", "<s>", "</s>"}


def seen_sentences(data_dir: Path, lang_dir: Path, refs: dict[str, str]) -> dict[str, str] | None:
    """Utterance -> ``seen`` where its reference is one of the transcripts of the lang's training split (named by
    ``lang_dir/manifest.json``), else ``new``; None when the lang names no training split found in ``data_dir``."""
    manifest = lang_dir / "manifest.json"
    train = json.loads(manifest.read_text()).get("train") if manifest.is_file() else None
    if not train or not (data_dir / train / "text").is_file():
        return None
    known = set(own_texts(data_dir / train).values())
    return {utt: "seen" if text in known else "new" for utt, text in refs.items()}


def _wers(by_group: dict[str, dict[str, Any]]) -> str:
    """One log line's WER and utterance count per group."""
    return ", ".join(f"{g} %WER {100 * s['wer']:.2f} ({s['n_utts']} utterances)" for g, s in by_group.items())


def score_split(data_dir: str | Path, test: str, decode_dir: str | Path, lang_dir: str | Path,
                out_json: str | Path, log=print, groups: dict[str, dict[str, Any]] | None = None,
                sentences: bool = False) -> dict[str, Any]:
    """Score ``decode_dir/hyp.txt`` against the test split's references; write the summary JSON.

    Writes ``<out>.json`` (keys: wer, ser, sub, del, ins, n_ref_words, n_utts, oov_rate, rtf, ...; with
    ``groups``, ``evaluation.groups``, a ``groups`` entry: attribute → group → WER and counts; with
    ``sentences``, for an LM estimated from the training transcripts, a ``sentences`` entry:
    :func:`seen_sentences` → WER and counts) and
    ``<out>.details.txt`` (Kaldi-style ref/hyp/op lines per utterance).
    """
    data_dir, decode_dir, out_json = Path(data_dir), Path(decode_dir), Path(out_json)
    refs = read_table(data_dir / test / "text")
    hyps = read_table(decode_dir / "hyp.txt") if (decode_dir / "hyp.txt").stat().st_size else {}
    utt2spk = read_table(data_dir / test / "utt2spk")
    # the LM's words (what the decoder can write): with corpus.extra_training the lexicon has more
    vocabulary = {w for w in arpa_words(Path(lang_dir) / "lm.arpa") if w not in NON_WORDS and w != "<unk>"}
    decode_info = json.loads((decode_dir / "manifest.json").read_text())
    summary, scores = score_corpus(refs, hyps, utt2spk, vocabulary, rtf=decode_info["rtf"])
    summary["test_set"] = test
    summary["decode_failed"] = len(decode_info["failed"])
    if "partial" in decode_info:  # utterances whose search reached no final state
        summary["decode_partial"] = len(decode_info["partial"])
    if groups:
        by_speaker = speaker_groups(data_dir / test, groups)
        summary["groups"] = {attribute: group_summaries(scores, {u: of[s] for u, s in utt2spk.items() if s in of})
                             for attribute, of in by_speaker.items()}
    if sentences and (sentence_of := seen_sentences(data_dir, Path(lang_dir), refs)) is not None:
        summary["sentences"] = group_summaries(scores, sentence_of)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(summary, indent=2) + "\n")
    out_json.with_suffix(".details.txt").write_text("\n".join(format_alignment(s) for s in scores) + "\n")
    log(f"{test}: %WER {100 * summary['wer']:.2f} [ {summary['errors']} / {summary['n_ref_words']}, "
        f"{summary['ins']} ins, {summary['del']} del, {summary['sub']} sub ] %SER {100 * summary['ser']:.2f} "
        f"OOV {100 * summary['oov_rate']:.2f}%")
    for attribute, by_group in summary.get("groups", {}).items():
        log(f"  by {attribute}: {_wers(by_group)}")
    if "sentences" in summary:
        log(f"  sentences of the LM's training transcripts: {_wers(summary['sentences'])}")
    return summary
