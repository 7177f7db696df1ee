"""Hybrid DNN-HMM: network log posteriors minus log priors, decoded with the GMM's HCLG.

The network predicts tied states (the triphone tree's pdfs). Scaled pseudo-likelihoods
``acoustic_scale · (log p(pdf | x) − log p(pdf))`` are laid out per transition id and
handed to Kaldi's lattice-faster decoder through the wheels' matrix decodable.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from asrflow.decode.decoder import DecodeOptions, DecodeResult, _graph
from asrflow.gmm.estep import Shard, features
from asrflow.gmm.model import GmmModel
from asrflow.kaldi import khg
from asrflow.nnet.models import build_model

_NETS: dict[str, tuple] = {}


def load_network(path: str | Path) -> tuple[torch.nn.Module, dict]:
    """A trained network from ``final.pt`` (``weights_only`` load), in eval mode."""
    saved = torch.load(path, weights_only=True)
    model = build_model(saved["config"], saved["input_dim"], saved["num_classes"])
    model.load_state_dict(saved["model"])
    return model.eval(), saved


def pdf_priors(targets: dict[str, np.ndarray], num_pdfs: int, floor: float = 1e-8) -> np.ndarray:
    """Log prior of each pdf from the training alignment counts."""
    counts = np.zeros(num_pdfs)
    for t in targets.values():
        counts += np.bincount(t, minlength=num_pdfs)
    return np.log(np.maximum(counts / counts.sum(), floor))


def transition_loglikes(log_post: np.ndarray, log_prior: np.ndarray, tid2pdf: np.ndarray,
                        acoustic_scale: float) -> np.ndarray:
    """Scaled pseudo-log-likelihoods with one column per transition id (column = tid − 1)."""
    pseudo = acoustic_scale * (log_post - log_prior[None, :])
    return np.ascontiguousarray(pseudo[:, tid2pdf[1:]], dtype=np.float32)


def decode_shard(shard: Shard, network_path: str, priors: np.ndarray, gmm_blob: bytes, graph_path: str,
                 opts: DecodeOptions) -> DecodeResult:
    """1-best word ids of a shard with the hybrid model (runs on a Dask worker)."""
    if network_path not in _NETS:
        _NETS[network_path] = load_network(network_path)
    network, _ = _NETS[network_path]
    gmm = GmmModel.from_bytes(gmm_blob)
    graph = _graph(graph_path)
    decoder = khg.LatticeFasterDecoder(graph, khg.LatticeFasterDecoderConfig(
        beam=opts.beam, max_active=opts.max_active, lattice_beam=opts.lattice_beam))
    hyps, failed, frames = {}, [], 0
    start = time.perf_counter()
    with torch.no_grad():
        for utt, x in zip(shard.utts, features(shard)):
            logits, _ = network(torch.from_numpy(x).unsqueeze(0), torch.tensor([x.shape[0]]))
            log_post = torch.log_softmax(logits[0], dim=-1).numpy()
            decodable = khg.DecodableCtc(transition_loglikes(log_post, priors, gmm.tid2pdf, opts.acoustic_scale))
            ok, _, words, _ = khg.decode_utterance_lattice_faster(decoder=decoder, decodable=decodable,
                                                                  trans_model=gmm.tm, utt=utt, allow_partial=True)
            hyps[utt] = [int(w) for w in words] if ok else []
            if not ok:
                failed.append(utt)
            frames += x.shape[0]
    return DecodeResult(hyps, failed, frames, time.perf_counter() - start)
