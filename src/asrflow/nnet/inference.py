"""Running a trained network: load ``final.pt`` once per process, log posteriors per utterance."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from asrflow.nnet.frames import frame_skipping
from asrflow.nnet.models import build_model
from asrflow.nnet.precision import autocast, with_precision
from asrflow.nnet.prune import unpacked

if TYPE_CHECKING:
    from asrflow.gmm.estep import Shard

_NETS: dict[tuple, tuple[torch.nn.Module, dict]] = {}


def load_network(path: str | Path) -> tuple[torch.nn.Module, dict]:
    """A trained network and its header from ``final.pt`` (``weights_only`` load; a pruned network's packed
    layers as stored), in eval mode."""
    saved = torch.load(path, weights_only=True, map_location="cpu")
    model = build_model(saved["config"], saved["input_dim"], saved["num_classes"])
    model.load_state_dict(unpacked(saved["model"], saved["config"].get("pruned", [])))
    return model.eval(), saved


def scoring_device(name: str) -> torch.device:
    """The device of ``nnet.decode.device``: ``cpu``, ``cuda`` (an error naming the key when torch sees no GPU)
    or ``auto`` (the GPU when torch sees one, else the CPU)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        from asrflow.nnet import NnetError

        raise NnetError(f"nnet.decode.device is cuda, but torch {torch.__version__} sees no GPU here "
                        f"(CUDA build: {torch.version.cuda or 'none'}); use cpu or auto")
    return torch.device(name)


def network_key(path: str | Path, frame_skip: int = 1, device: str = "cpu", precision: str = "float32") -> tuple:
    """What identifies a network loaded for scoring: its file (path and modification time), frame skipping,
    device (``auto`` resolved) and precision."""
    return str(path), os.stat(path).st_mtime_ns, frame_skip, str(scoring_device(device)), precision


def cached_network(path: str | Path, frame_skip: int = 1, device: str = "cpu",
                   precision: str = "float32") -> tuple[torch.nn.Module, dict]:
    """:func:`load_network`, cached by path, modification time, frame skipping, device and precision (Dask workers
    reuse it); with ``frame_skip`` k > 1 set to compute every k-th frame
    (:func:`~asrflow.nnet.frames.frame_skipping`), on ``device`` (:func:`scoring_device`), made ready for
    ``precision`` (:mod:`asrflow.nnet.precision`).

    Decoding tasks run one per core, so torch gets one thread here: letting every worker
    start as many threads as there are cores made LSTM decoding 25× slower on 2 cores.
    """
    torch.set_num_threads(1)
    target = scoring_device(device)
    key = network_key(path, frame_skip, device, precision)
    if key not in _NETS:
        model, saved = load_network(path)
        model = frame_skipping(model, frame_skip) if frame_skip > 1 else model
        _NETS[key] = with_precision(model.to(target), precision, target), saved
    return _NETS[key]


@dataclass(frozen=True)
class Scoring:
    """How a decoding worker runs a trained network: its ``final.pt``, frame skipping (``nnet.decode.frame_skip``),
    padded frames per forward pass (``nnet.decode.batch_frames``), device (``nnet.decode.device``) and precision
    (``nnet.decode.precision``)."""

    network: str
    frame_skip: int = 1
    batch_frames: int = 2000
    device: str = "cpu"
    keep: bool = False  # keep each shard's log posteriors in the worker: a tuning search decodes them again
    precision: str = "float32"

    def load(self) -> tuple[torch.nn.Module, dict]:
        """The network (cached per worker, on its device, in its precision) and its ``final.pt`` header."""
        return cached_network(self.network, self.frame_skip, self.device, self.precision)

    def log_posteriors(self, feats: list[np.ndarray]) -> list[np.ndarray]:
        """Per-frame log posteriors of each utterance (:func:`batch_log_posteriors`)."""
        return batch_log_posteriors(self.load()[0], feats, self.batch_frames, self.precision)

    def shard_log_posteriors(self, shard: Shard) -> tuple[list[int], list[np.ndarray]]:
        """Each utterance's input frames and log posteriors of a shard (its features as
        :func:`~asrflow.gmm.estep.features` reads them); with ``keep``, kept in the worker for the
        next call with this network and shard (:func:`~asrflow.decode.decoder.kept_scores`)."""
        from asrflow.decode.decoder import kept_scores
        from asrflow.gmm.estep import features

        def score() -> tuple[list[int], list[np.ndarray]]:
            feats = features(shard)
            return [x.shape[0] for x in feats], self.log_posteriors(feats)

        model = network_key(self.network, self.frame_skip, self.device, self.precision) if self.keep else None
        return kept_scores(model, shard, score)


def log_posteriors(network: torch.nn.Module, feats: np.ndarray, precision: str = "float32") -> np.ndarray:
    """Per-output-frame log posteriors ``(frames', classes)`` of one utterance (on the CPU; bfloat16 autocast
    with ``precision`` bfloat16)."""
    with torch.no_grad(), autocast(precision, torch.device("cpu")):
        logits, lengths = network(torch.from_numpy(np.ascontiguousarray(feats)).unsqueeze(0),
                                  torch.tensor([feats.shape[0]]))
        return torch.log_softmax(logits[0, : int(lengths[0])].float(), dim=-1).numpy()


def batch_log_posteriors(network: torch.nn.Module, feats: list[np.ndarray], max_frames: int = 20000,
                         precision: str = "float32") -> list[np.ndarray]:
    """:func:`log_posteriors` of many utterances, run in length-sorted padded batches.

    Batches hold at most ``max_frames`` padded frames; padding repeats each utterance's last
    frame, and every model gives the same output for an utterance alone or in a batch. Each batch
    runs on the network's device (bfloat16 autocast there with ``precision`` bfloat16) and its log
    posteriors come back to the CPU.
    """
    from asrflow.nnet.data import collate

    device = next(network.parameters(), torch.empty(0)).device
    order = sorted(range(len(feats)), key=lambda i: feats[i].shape[0])
    out: list[np.ndarray | None] = [None] * len(feats)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and feats[order[end]].shape[0] * (end - start + 1) <= max_frames:
            end += 1
        group = order[start:end]
        batch = collate([("", torch.from_numpy(np.ascontiguousarray(feats[i])), None) for i in group])
        with torch.no_grad(), autocast(precision, device):
            logits, lengths = network(batch["feats"].to(device), batch["lengths"].to(device))
            log_post = torch.log_softmax(logits.float(), dim=-1).cpu().numpy()
        for row, i in enumerate(group):
            out[i] = log_post[row, : int(lengths[row])]
        start = end
    return out  # type: ignore[return-value]
