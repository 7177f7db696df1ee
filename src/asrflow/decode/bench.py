"""Decoding speed of trained networks on one core: the network's forward pass and the graph search timed apart.

``asrflow bench networks`` decodes every n-th utterance of a test split with each network as its decode
stage would (its own ``decode`` settings over ``nnet.decode``, the tuned acoustic scale and insertion
penalty when the tune stage has run), in this process and one thread, and prints one JSON line per
network: parameters, size on disk, forward and search real-time factors, WER on those utterances and,
on the first few utterances, the share of output classes the search reads per frame (what evaluating
the output layer lazily, only for the classes the search asks for, could save at most) and how much slower
the search is when every score it reads is answered by Python code (what computing them on demand through
the decoder's Python interface would cost before any arithmetic).
"""

from __future__ import annotations

import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.config import model_cmvn
from asrflow.config.paths import Paths
from asrflow.config.settings import decoder_kind, decoding
from asrflow.data.datadir import read_table
from asrflow.decode.decoder import DecodeOptions, decode_all, decode_settings, lattice_comparison, vector_comparison
from asrflow.decode.tune import tuned_settings
from asrflow.gmm.estep import features
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.kaldi import khg
from asrflow.nnet import NnetError


class CountingDecodable(khg.DecodableInterface):
    """A decodable over a score matrix that records which columns the search reads at each frame."""

    def __init__(self, scores: np.ndarray) -> None:
        super().__init__()
        self.scores = scores
        self.read: list[set[int]] = [set() for _ in range(len(scores))]

    def log_likelihood(self, frame: int, index: int) -> float:
        self.read[frame].add(index - 1)
        return float(self.scores[frame, index - 1])

    def num_frames_ready(self) -> int:
        return len(self.scores)

    def is_last_frame(self, frame: int) -> bool:
        return frame == len(self.scores) - 1

    def num_indices(self) -> int:
        return self.scores.shape[1]


def read_share(graph: str, opts: DecodeOptions, matrices: list[np.ndarray],
               columns_to_classes: np.ndarray | None) -> tuple[float, float]:
    """Mean share of output classes whose score the search reads per frame (columns mapped to classes by
    ``columns_to_classes``: a transition id's pdf; None when columns are the classes), and how many times
    longer the search takes when each score is answered by a Python decodable (as scores computed on demand
    would be) than from the matrix."""
    shares = []
    classes = int(columns_to_classes.max()) + 1 if columns_to_classes is not None else matrices[0].shape[1]
    counting = [CountingDecodable(scores) for scores in matrices]
    start = time.perf_counter()
    decode_all(graph, opts, [("utt", len(d.scores), lambda d=d: d) for d in counting])
    answered = time.perf_counter() - start
    start = time.perf_counter()
    decode_all(graph, opts, [("utt", len(m), lambda m=m: khg.DecodableCtc(m)) for m in matrices])
    from_matrix = time.perf_counter() - start
    for decodable in counting:
        for columns in decodable.read:
            read = {int(columns_to_classes[c]) for c in columns} if columns_to_classes is not None else columns
            shares.append(len(read) / classes)
    return (float(np.mean(shares)) if shares else 0.0), answered / max(from_matrix, 1e-9)


def _paths(inputs: dict[str, str]) -> Paths:
    known = {f.name for f in fields(Paths)}
    return Paths(out=Path("."), **{k: Path(v) for k, v in inputs.items() if k in known})


def _sample(config: dict[str, Any], system: str, paths: Paths, test: str, every: int,
            texts: dict[str, str] | None = None) -> tuple[list[str], list[np.ndarray]]:
    """Every ``every``-th utterance of ``test`` (sorted ids; ``texts``: its transcripts, read when None) and its
    features as network ``system`` reads them."""
    texts = read_table(Path(paths.data) / test / "text") if texts is None else texts
    chosen = sorted(texts)[::every]
    shards = split_shards(paths.data, paths.features, paths.lang, test, len(chosen), only=set(chosen), deltas=0,
                          cmvn=model_cmvn(config, system))
    return [u for s in shards for u in s.utts], [x for s in shards for x in features(s)]


def forward_benchmark(config: dict[str, Any], system: str, inputs: dict[str, str], test: str, every: int,
                      batches: list[int], log=print) -> dict[str, Any]:
    """The forward pass alone of hybrid network ``system`` as configured, untrained (random weights: its cost
    does not depend on them), on every ``every``-th utterance of ``test`` in one thread, timed with each of
    ``batches`` padded frames per batch (``rtf_forward_by_batch``): how fast a network of that shape scores
    speech, and the ``nnet.decode.batch_frames`` that suits it, before hours of training."""
    import torch

    from asrflow.nnet.frames import frame_skipping
    from asrflow.nnet.inference import batch_log_posteriors
    from asrflow.nnet.models import build_model, parameter_count

    paths = _paths(inputs)
    model = config["nnet"]["models"][system]
    if decoder_kind(model) != "hclg" or model["type"] == "ensemble":
        raise NnetError(f"{system}: --untrained times a hybrid network's own layers (an ensemble: time its members)")
    torch.set_num_threads(1)
    utts, feats = _sample(config, system, paths, test, every)
    network = build_model(model, feats[0].shape[1], GmmModel.load(paths.gmm).am.num_pdfs).eval()
    skip = decoding(config, system).frame_skip
    network = frame_skipping(network, skip) if skip > 1 else network
    audio = sum(len(x) for x in feats) * 0.01
    row = {"system": system, "test": test, "every": every, "utterances": len(utts), "audio_seconds": round(audio, 1),
           "parameters": parameter_count(network), "trained": False, "frame_skip": skip, "threads": 1,
           "rtf_forward_by_batch": {}}
    for size in batches:
        start = time.perf_counter()
        batch_log_posteriors(network, feats, size)
        row["rtf_forward_by_batch"][str(size)] = round((time.perf_counter() - start) / audio, 4)
    log(f"{system} (untrained): forward RTF by padded frames per batch {row['rtf_forward_by_batch']}")
    return row


def network_benchmark(config: dict[str, Any], system: str, inputs: dict[str, str], test: str, every: int,
                      counted: int = 0, batches: list[int] | None = None, device: str | None = None,
                      precision: str | None = None, lattice: bool = False, vector: bool = False,
                      log=print) -> dict[str, Any]:
    """Decode every ``every``-th utterance of ``test`` (sorted ids) with network ``system`` (its decode-stage
    ``inputs``) on one core; the row of timings, sizes and WER (see the module's docstring). ``counted``
    utterances are decoded again with a counting decodable for the share of classes read per frame; the
    forward pass is timed again with each of ``batches`` padded frames per batch (``rtf_forward_by_batch``).
    ``device`` (cpu, cuda, auto) replaces the network's ``nnet.decode.device`` for the forward pass; on a GPU
    one utterance is run first, so that the timing leaves out the GPU's start-up; ``precision`` likewise replaces
    ``nnet.decode.precision``. With ``lattice`` a hybrid's
    scores are searched again by Kaldi's lattice-faster decoder (:func:`lattice_search`): its search time, the
    speed-up and the utterances whose words differ join the row; with ``vector`` likewise through the graph held
    as a VectorFst (:func:`vector_search`)."""
    import torch

    from asrflow.decode import ctc
    from asrflow.nnet import hybrid
    from asrflow.nnet.inference import Scoring, load_network
    from asrflow.nnet.models import parameter_count
    from asrflow.score.wer import score_corpus

    paths = _paths(inputs)
    model = config["nnet"]["models"][system]
    kind = decoder_kind(model)
    if kind == "prefix" or paths.graph is None:
        raise NnetError(f"{system}: the bench times graph searches (hybrids, CTC over phones), not prefix search")
    if lattice and kind != "hclg":
        raise NnetError(f"{system}: --lattice compares HCLG searches (hybrids); a TLG has no transition model")
    dcfg = decoding(config, system)
    if device is not None:
        dcfg = replace(dcfg, device=device)
    if precision is not None:
        dcfg = replace(dcfg, precision=precision)
    tuned = tuned_settings(paths.tune)
    texts = read_table(Path(paths.data) / test / "text")
    utts, feats = _sample(config, system, paths, test, every, texts)
    final = Path(paths.model) / "final.pt"
    scoring = Scoring(str(final.resolve()), dcfg.frame_skip, dcfg.batch_frames, dcfg.device,
                      precision=dcfg.precision)
    network, header = scoring.load()
    on = next(network.parameters(), torch.empty(0)).device
    if on.type == "cuda":
        scoring.log_posteriors(feats[:1])
    start = time.perf_counter()
    posteriors = scoring.log_posteriors(feats)
    forward = time.perf_counter() - start
    if kind == "hclg":
        opts = replace(hybrid.decode_options(dcfg, config["decode"]), **tuned)
        gmm = GmmModel.load(paths.gmm)
        priors = np.load(Path(paths.model) / "priors.npy")
        graph, columns = str(Path(paths.graph).resolve() / "HCLG.fst"), gmm.tid2pdf[1:]

        def loglikes(p: np.ndarray, o: DecodeOptions) -> np.ndarray:
            return hybrid.transition_loglikes(p, priors, gmm.tid2pdf, o.acoustic_scale)
    else:
        opts = replace(ctc.graph_options(dcfg, config["decode"]), **tuned)
        graph, columns, loglikes = str(Path(paths.graph).resolve() / "TLG.fst"), None, ctc.scaled_posteriors
    (result,) = decode_settings(utts, [len(x) for x in feats], posteriors, 0.0, graph, [opts], loglikes)
    summary, _ = score_corpus({u: texts[u] for u in utts}, {u: " ".join(w) for u, w in result.hyps.items()})
    audio = result.frames * opts.frame_shift
    counted_net = network if dcfg.precision != "int8" else load_network(final)[0]  # int8 layers hold no parameters
    out = counted_net.output if hasattr(counted_net, "output") else None
    row = {"system": system, "test": test, "every": every, "utterances": len(utts), "audio_seconds": round(audio, 1),
           "parameters": parameter_count(counted_net), "model_bytes": final.stat().st_size,
           "precision": dcfg.precision,
           "frame_skip": dcfg.frame_skip, "multi_frame": int(header["config"].get("multi_frame", 1)),
           "batch_frames": dcfg.batch_frames, "beam": opts.beam, "max_active": opts.max_active,
           "acoustic_scale": opts.acoustic_scale, "insertion_penalty": opts.insertion_penalty,
           "forward_seconds": round(forward, 2), "search_seconds": round(result.seconds, 2),
           "rtf_forward": round(forward / audio, 4), "rtf_search": round(result.seconds / audio, 4),
           "rtf": round((forward + result.seconds) / audio, 4), "wer": round(summary["wer"], 4),
           "sub": summary["sub"], "del": summary["del"], "ins": summary["ins"], "threads": torch.get_num_threads(),
           "device": torch.cuda.get_device_name(on) if on.type == "cuda" else "cpu",
           "output_weights": sum(p.numel() for p in out.parameters()) if out is not None else None,
           "partial_paths": len(result.partial)}
    items = [(u, len(p), lambda p=p: khg.DecodableCtc(loglikes(p, opts))) for u, p in zip(utts, posteriors)]
    if lattice:
        row.update(lattice_comparison(graph, gmm.tm, opts, items, result))
    if vector:
        row.update(vector_comparison(graph, opts, items, result))
    if batches:
        row["rtf_forward_by_batch"] = {}
        for size in batches:
            start = time.perf_counter()
            replace(scoring, batch_frames=size).log_posteriors(feats)
            row["rtf_forward_by_batch"][str(size)] = round((time.perf_counter() - start) / audio, 4)
    if counted:
        matrices = [loglikes(p, opts) for p in posteriors[:counted]]
        share, slowdown = read_share(graph, opts, matrices, columns)
        row["classes_read_per_frame"], row["python_decodable_slowdown"] = round(share, 4), round(slowdown, 2)
        row["counted_utterances"] = len(matrices)
    log(f"{system}: RTF {row['rtf']} (forward {row['rtf_forward']}, search {row['rtf_search']}), "
        f"WER {100 * row['wer']:.2f} % on {len(utts)} utterances")
    return row
