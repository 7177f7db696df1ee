"""Transcribe wav files with a trained network: the logic behind the MLflow pyfunc model.

A :class:`Transcriber` is built from a handful of files (the bundle logged with the model):
``network`` (final.pt), ``settings`` (JSON: feature options, objective, decoder, decode
options) and, for a hybrid network, ``gmm`` (final.mdl.pkl), ``graph`` (HCLG.fst) and
``words`` (words.txt beside it); for CTC over phones ``graph`` (TLG.fst) and ``words``; for
other CTC networks, optionally ``lm`` (lm.arpa). Audio is read, resampled
and featurised exactly as in training. A network trained with ``cmvn: utterance`` normalises
each file by its own mean, as in training. A single file has no speaker, so a network trained
with per-speaker CMVN is given ``cmvn`` instead (the training split's pooled statistics,
``cmvn.npy``): a mismatch, which cost FSDD's DNN 3 and its CTC model 37 of the 300 test files more than
the decode stage lost (docs/nnet.md, "The MLflow model").
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.config.paths import Paths
from asrflow.config.settings import Decoding
from asrflow.features.compute import FeatureOptions, compute
from asrflow.features.transforms import apply_cmvn

SETTINGS = "settings.json"


def pooled_cmvn(feats_dir: Path, split: str) -> np.ndarray:
    """The sum of a split's per-speaker CMVN statistics (global mean over its speakers)."""
    import kaldiio

    return sum(stats for _, stats in kaldiio.load_scp(str(feats_dir / split / "cmvn.scp")).items())


def bundle_files(config: dict[str, Any], system: str, train: str, paths: Paths,
                 tuned: dict[str, float] | None = None) -> dict[str, str]:
    """The files a :class:`Transcriber` needs, by name (none for networks that read fmllr features): the network
    in ``paths.model``, its features' statistics (``paths.features``), graph (``paths.gmm``, ``paths.graph``) or
    LM (``paths.lang``).

    ``settings.json`` and, for per-speaker CMVN, ``cmvn.npy`` are written into ``paths.out``.
    ``tuned`` (the tune stage's choice) replaces the configured decoder settings, so the
    model decodes as the test sets were decoded.
    """
    from asrflow.config import model_cmvn, model_features
    from asrflow.config.settings import decoder_kind, decoding
    from asrflow.decode.tune import AXES

    if model_features(config, system) == "fmllr":
        return {}  # no transcriber: adapted features need a GMM first pass over each speaker's utterances
    out_dir, net_dir, feats_dir = paths.out, paths.model, paths.features
    gmm_dir, graph_dir, lang_dir = paths.gmm, paths.graph, paths.lang
    model = config["nnet"]["models"][system]
    kind = decoder_kind(model)
    decode = {**decoding(config, system).as_dict(), **{AXES[kind][k]: v for k, v in (tuned or {}).items()}}
    opts = FeatureOptions.from_config(config["features"], model_features(config, system),
                                      config["audio"]["sample_rate"])
    cmvn = model_cmvn(config, system)
    settings = {"system": system, "objective": model["objective"], "decoder": kind, "features": asdict(opts),
                "cmvn": cmvn, "decode": decode, "tuned": tuned or {}, "graph_decode": config["decode"],
                "seed": config["seed"]}
    (out_dir / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")
    files = {"network": net_dir / "final.pt", "settings": out_dir / SETTINGS}
    if cmvn == "speaker":
        np.save(out_dir / "cmvn.npy", pooled_cmvn(feats_dir, train))
        files["cmvn"] = out_dir / "cmvn.npy"
    if kind == "hclg":
        files.update(gmm=gmm_dir / "final.mdl.pkl", graph=graph_dir / "HCLG.fst", words=graph_dir / "words.txt")
    elif kind == "tlg":
        files.update(graph=graph_dir / "TLG.fst", words=graph_dir / "words.txt")
    elif lang_dir is not None and decode["lm_weight"] > 0:
        files["lm"] = lang_dir / "lm.arpa"
    return {k: str(v) for k, v in files.items()}


class Transcriber:
    """Wav files in, transcripts out, for one trained network."""

    def __init__(self, files: dict[str, str]) -> None:
        import torch

        from asrflow.nnet.frames import frame_skipping
        from asrflow.nnet.inference import load_network
        from asrflow.nnet.precision import with_precision

        self.settings = json.loads(Path(files["settings"]).read_text())
        self.network, self.header = load_network(files["network"])
        decode = Decoding.from_saved(self.settings["decode"])  # scored as the decode stage scores it, on the CPU
        if decode.frame_skip > 1:
            self.network = frame_skipping(self.network, decode.frame_skip)
        self.network = with_precision(self.network, decode.precision, torch.device("cpu"))
        self.precision = decode.precision
        self.features = FeatureOptions(**self.settings["features"])
        self.cmvn = np.load(files["cmvn"]) if files.get("cmvn") else None
        self.files = files
        self._workdir = None
        self.kind = self.settings.get("decoder", "hclg" if self.settings["objective"] == "hybrid" else "prefix")
        if self.kind in ("hclg", "tlg"):
            # decode_all reads words.txt beside the graph: keep both in one private folder
            self._workdir = tempfile.mkdtemp(prefix="asrflow-graph-")
            # removed by close(), when the transcriber is collected, or at exit
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, ignore_errors=True)
            self.graph = f"{self._workdir}/{Path(files['graph']).name}"
            shutil.copy(files["graph"], self.graph)
            shutil.copy(files["words"], f"{self._workdir}/words.txt")
        if self.kind == "hclg":
            from asrflow.gmm.model import GmmModel

            self.gmm = GmmModel.from_bytes(Path(files["gmm"]).read_bytes())
        elif self.kind == "prefix":
            from asrflow.lang.lm import ArpaLM
            from asrflow.nnet.units import Units

            self.units = Units(self.header["units"].numpy().tobytes())
            self.lm = ArpaLM(files["lm"]) if files.get("lm") else None

    def close(self) -> None:
        """Remove the private copy of the graph (the transcriber cannot decode with a graph afterwards)."""
        if self._workdir is not None:
            self._cleanup()

    def raw_features(self, path: str) -> np.ndarray:
        """Features of one audio file, before mean normalisation."""
        from asrflow.data.audio import read_audio, resample
        from asrflow.features.stage import INT16_SCALE

        samples, rate = read_audio(path)
        signal = resample(samples, rate, self.features.sample_rate) * np.float32(INT16_SCALE)
        return compute(signal, self.features, key=Path(path).name, seed=self.settings["seed"])

    def featurise(self, paths: list[str], one_speaker: bool = False) -> list[np.ndarray]:
        """Features of the audio files, normalised as the network was trained: with per-speaker CMVN, the
        statistics of all ``paths`` together when they are ``one_speaker``'s (as the decode stage normalises a
        test speaker), else the pooled training statistics; with per-utterance CMVN (or a bundle without
        ``cmvn``) each file's own."""
        from asrflow.features.transforms import cmvn_stats

        raw = [self.raw_features(p) for p in paths]
        stats = self.cmvn
        if one_speaker and stats is not None and raw:
            stats = sum(cmvn_stats(x) for x in raw)
        return [apply_cmvn(x, stats) for x in raw]

    def transcribe(self, paths: list[str], one_speaker: bool = False) -> list[str]:
        """One transcript per file; ``one_speaker``: the files are one speaker's (:meth:`featurise`)."""
        from asrflow.nnet.inference import log_posteriors

        feats = self.featurise(paths, one_speaker)
        decode = Decoding.from_saved(self.settings["decode"])
        if self.kind in ("hclg", "tlg"):
            from asrflow.decode.ctc import graph_options, scaled_posteriors
            from asrflow.decode.decoder import decode_settings
            from asrflow.nnet.hybrid import decode_options, transition_loglikes

            utts = [str(i) for i in range(len(feats))]
            posteriors = [log_posteriors(self.network, x, self.precision) for x in feats]
            if self.kind == "hclg":
                priors = self.header["priors"].numpy()
                opts = decode_options(decode, self.settings["graph_decode"])
                loglikes = lambda p, o: transition_loglikes(p, priors, self.gmm.tid2pdf, o.acoustic_scale)  # noqa: E731
            else:
                opts, loglikes = graph_options(decode, self.settings["graph_decode"]), scaled_posteriors
            result = decode_settings(utts, [x.shape[0] for x in feats], posteriors, 0.0, self.graph, [opts],
                                     loglikes)[0]
            return [" ".join(result.hyps[u]) for u in utts]
        from asrflow.decode.ctc import prefix_beam_search, search_options, vocabulary_for

        opts = search_options(decode)
        vocabulary = vocabulary_for(opts, self.lm)
        return [" ".join(prefix_beam_search(log_posteriors(self.network, x, self.precision), self.units.pieces,
                                            self.units.word_start, self.lm if opts.lm_weight > 0 else None, opts,
                                            vocabulary)) for x in feats]
