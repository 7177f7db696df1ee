"""Hybrid DNN-HMM: network log posteriors minus log priors, decoded with the GMM's HCLG.

The network predicts tied states (the triphone tree's pdfs). Scaled pseudo-likelihoods
``acoustic_scale · (log p(pdf | x) − log p(pdf))`` are laid out per transition id and
handed to Kaldi's faster decoder through the wheels' matrix decodable.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from asrflow.config.settings import Decoding
from asrflow.decode.decoder import DecodeOptions, DecodeResult, decode_settings, transition_columns
from asrflow.gmm.estep import Shard
from asrflow.gmm.model import GmmModel
from asrflow.nnet.inference import Scoring, batch_log_posteriors


def decode_options(nnet_decode: Decoding, graph_decode: dict) -> DecodeOptions:
    """Decoder settings of a hybrid: ``nnet.decode`` beam and active states, else the GMM's ``decode``."""
    return DecodeOptions(beam=nnet_decode.graph_beam or graph_decode["beam"],
                         max_active=nnet_decode.max_active or graph_decode["max_active"],
                         acoustic_scale=nnet_decode.acoustic_scale,
                         insertion_penalty=nnet_decode.insertion_penalty)


def pdf_priors(targets: dict[str, np.ndarray], num_pdfs: int, floor: float = 1e-8) -> np.ndarray:
    """Log prior of each pdf from the training alignment counts."""
    counts = np.zeros(num_pdfs)
    for t in targets.values():
        counts += np.bincount(t, minlength=num_pdfs)
    return np.log(np.maximum(counts / counts.sum(), floor))


def spread_indices(lengths: list[int], frames: int) -> list[int]:
    """Indices of utterances spread evenly over ``lengths`` (frames per utterance) whose frames add up to about
    ``frames`` (every utterance when they hold fewer)."""
    total = sum(lengths)
    if total <= frames:
        return list(range(len(lengths)))
    count = max(1, round(len(lengths) * frames / total))
    return sorted({int(i * len(lengths) / count) for i in range(count)})


def posterior_priors(network: Any, feats: Iterable[np.ndarray], num_pdfs: int, floor: float = 1e-8,
                     batch: int = 32) -> tuple[np.ndarray, int]:
    """Log pdf priors from a trained network's own average posteriors over ``feats`` (Kaldi nnet2/nnet3's
    adjust-priors), and the frames averaged.

    Dividing by these rather than by the alignment counts (:func:`pdf_priors`) makes the network's
    pseudo-likelihoods average to one for every pdf over the training frames: a network that
    predicts a pdf (silence, say) more or less often than the alignments hold it is not pushed
    further in that direction by the decoder.
    """
    total, frames = np.zeros(num_pdfs), 0
    utterances = iter(feats)
    while chunk := list(itertools.islice(utterances, batch)):  # a few utterances in memory at a time
        for log_post in batch_log_posteriors(network, chunk):
            total += np.exp(log_post.astype(np.float64)).sum(axis=0)
            frames += len(log_post)
    if frames == 0:
        raise ValueError("no frames to average the network's posteriors over")
    return np.log(np.maximum(total / frames, floor)), frames


def transition_loglikes(log_post: np.ndarray, log_prior: np.ndarray, tid2pdf: np.ndarray,
                        acoustic_scale: float) -> np.ndarray:
    """Scaled pseudo-log-likelihoods with one column per transition id (column = tid − 1)."""
    return transition_columns(log_post - log_prior[None, :], tid2pdf, acoustic_scale)


def decode_shard_settings(shard: Shard, scoring: Scoring, priors: np.ndarray, gmm_blob: bytes, graph_path: str,
                          settings: list[DecodeOptions]) -> list[DecodeResult]:
    """1-best words of a shard with the hybrid model, once per decoder setting (runs on a Dask worker).

    One forward pass (padded batches) serves every setting, and each RTF includes it
    (:func:`asrflow.decode.decoder.decode_settings`).
    """
    scoring.load()
    gmm = GmmModel.from_bytes(gmm_blob)
    start = time.perf_counter()
    frames, posteriors = scoring.shard_log_posteriors(shard)
    return decode_settings(shard.utts, frames, posteriors, time.perf_counter() - start,
                           graph_path, settings,
                           lambda p, opts: transition_loglikes(p, priors, gmm.tid2pdf, opts.acoustic_scale))
