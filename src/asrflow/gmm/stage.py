"""The gmm stage: train one system (``mono`` or ``tri``) on a training split and write it out.

Output folder (``results/<exp>/gmm/<train split>/<system>/``)::

    final.mdl.pkl  tree          the model (tree also in Kaldi's binary format)
    ali/transition_ids.txt       forced alignment of every training utterance (Kaldi text archives)
    ali/pdfs.txt  ali/phones.txt frame-level pdf ids and phone symbols
    report.tsv                   utterances that could not be aligned, and why
    alignment.png                one alignment drawn over its spectrogram
    manifest.json                pdfs, Gaussians, iterations, timing, log-likelihood
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.gmm.train import TrainResult, train_mono, train_tri
from asrflow.lang.graph import read_symbols


def write_alignments(folder: Path, model: GmmModel, alignments: dict[str, np.ndarray], phones_txt: Path) -> None:
    """Transition ids, pdf ids and phone symbols per frame (``ali-to-pdf``, ``ali-to-phones --per-frame``)."""
    folder.mkdir(parents=True, exist_ok=True)
    id2phone = {i: p for p, i in read_symbols(phones_txt).items()}
    phone_of, _ = model.tid_tables
    with open(folder / "transition_ids.txt", "w") as tids, open(folder / "pdfs.txt", "w") as pdfs, \
            open(folder / "phones.txt", "w") as phones:
        for utt in sorted(alignments):
            ali = alignments[utt]
            tids.write(f"{utt} {' '.join(map(str, ali))}\n")
            pdfs.write(f"{utt} {' '.join(map(str, model.tid2pdf[ali]))}\n")
            phones.write(f"{utt} {' '.join(id2phone[int(p)] for p in phone_of[ali])}\n")


def read_alignments(path: Path) -> dict[str, np.ndarray]:
    """Read ``ali/transition_ids.txt``."""
    out = {}
    for line in path.read_text().splitlines():
        utt, *ids = line.split()
        out[utt] = np.asarray(ids, dtype=np.int32)
    return out


def plot_alignment(path: Path, feats: np.ndarray, phones: list[str], utt: str) -> None:
    """Draw the phone segmentation of one utterance over its (MFCC/filterbank) feature image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.imshow(feats.T, aspect="auto", origin="lower", cmap="magma")
    start = 0
    for t in range(1, len(phones) + 1):
        if t == len(phones) or phones[t] != phones[start]:
            ax.axvline(start, color="cyan", linewidth=0.8)
            ax.text((start + t) / 2, feats.shape[1] * 0.92, phones[start], color="white", ha="center", fontsize=8)
            start = t
    ax.set_title(f"{utt}: forced alignment (phones) over the features")
    ax.set_xlabel("frame (10 ms)")
    ax.set_ylabel("feature bin")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train_system(config: dict[str, Any], system: str, train: str, data_dir: str | Path, feats_dir: str | Path,
                 lang_dir: str | Path, out_dir: str | Path, client: Any, run: Any, mono_dir: str | Path | None = None,
                 log=print) -> dict[str, Any]:
    """Train ``system`` on split ``train`` and write the output folder; returns the manifest."""
    out, lang_dir = Path(out_dir), Path(lang_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = split_shards(data_dir, feats_dir, lang_dir, train, config["gmm"]["shard_utts"])

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        run.log_metrics({f"{system}.{k}": v for k, v in metrics.items()}, step=step)

    if system == "mono":
        result: TrainResult = train_mono(config, shards, lang_dir, client, on_metrics, log)
    else:
        if mono_dir is None:
            raise ValueError("the tri system needs the mono system's folder")
        mono = GmmModel.load(mono_dir)
        mono_ali = read_alignments(Path(mono_dir) / "ali" / "transition_ids.txt")
        result = train_tri(config, shards, lang_dir, mono, mono_ali, client, on_metrics, log)
    result.model.save(out)
    write_alignments(out / "ali", result.model, result.alignments, lang_dir / "phones.txt")
    with open(out / "report.tsv", "w") as report:
        report.write("utt_id\treason\n")
        report.writelines(f"{u}\t{r}\n" for u, r in sorted(result.failed.items()))
    example = next((s for s in shards if s.utts[0] in result.alignments), None)
    if example is not None:
        from asrflow.gmm.estep import features

        utt = example.utts[0]
        id2phone = {i: p for p, i in read_symbols(lang_dir / "phones.txt").items()}
        phone_of, _ = result.model.tid_tables
        static = features(example)[0][:, : features(example)[0].shape[1] // 3]
        plot_alignment(out / "alignment.png", static, [id2phone[int(p)] for p in phone_of[result.alignments[utt]]],
                       utt)
    manifest = {"system": system, "train": train, "pdfs": result.model.am.num_pdfs,
                "gaussians": result.model.am.num_gauss, "iterations": result.iterations,
                "aligned": len(result.alignments), "failed": len(result.failed),
                "seconds": round(result.seconds, 3), "utterances": sum(len(s.utts) for s in shards), **result.info}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"{system}: {manifest['pdfs']} pdfs, {manifest['gaussians']} Gaussians, {manifest['aligned']} aligned, "
        f"{manifest['failed']} failed, {manifest['seconds']:.1f} s")
    return manifest
