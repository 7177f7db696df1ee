"""Sequence-discriminative training of hybrids: MMI against the decoding graph (lattice-free).

Frame cross-entropy asks each frame for its aligned tied state alone. Maximum mutual
information (Bahl et al., 1986; Povey, 2005) asks for the whole utterance: the aligned
state sequence must win against every path of the decoding graph, weighted as the decoder
weighs them, so the network learns most where the decoder would go wrong (a word read
into a stretch the alignment calls silence). Per utterance, with pseudo log-likelihoods
``ℓ_t(s) = κ (log P(s | x_t) − log P(s))`` (the decoder's, at acoustic scale κ):

    MMI = log Σ_{paths p of HCLG} exp(Σ_t ℓ_t(pdf(p_t)) − cost(p))  −  Σ_t ℓ_t(a_t)

where ``a`` is the GMM alignment's pdf sequence. The numerator's graph cost does not depend
on the network and is left out, so the value is MMI up to a constant per utterance (it can be
negative); its gradient is exact: ``κ (γ_den − onehot(a))`` on the log posteriors.

The denominator is the forward algorithm over the whole HCLG, as in lattice-free MMI
(Povey et al., 2016) but over the word-level graph the decoder uses rather than a phone LM:
no lattices, nothing stale. It is run in float64 on probabilities rescaled every frame, with
its own backward pass (forward-backward); its time grows with frames × batch × arcs, which
suits the small graphs of digit and command corpora (yesno, FSDD). For larger vocabularies
the denominator can be a phone n-gram LM instead (``nnet/phone_lm.py``), as in Kaldi's chain
models; both reach this module as an HCLG (:func:`denominator_from_fst`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from asrflow.nnet.objectives import LossStats, frame_cross_entropy


@dataclass(frozen=True)
class DenominatorGraph:
    """An acceptor over pdf ids with probabilities on its arcs and final states."""

    src: torch.Tensor  # (A,) int64 source state of each arc
    dst: torch.Tensor  # (A,) int64 destination state
    pdf: torch.Tensor  # (A,) int64 pdf the arc consumes a frame of
    weight: torch.Tensor  # (A,) float64 exp(−graph cost)
    final: torch.Tensor  # (S,) float64 exp(−final cost), 0 for non-final states
    start: int

    @property
    def num_states(self) -> int:
        return int(self.final.shape[0])

    def to(self, device: torch.device) -> DenominatorGraph:
        return DenominatorGraph(self.src.to(device), self.dst.to(device), self.pdf.to(device),
                                self.weight.to(device), self.final.to(device), self.start)


def graph_from_arcs(arcs: list[tuple[int, int, int, float]], finals: dict[int, float], start: int,
                    num_states: int) -> DenominatorGraph:
    """A graph from ``(src, dst, pdf, cost)`` arcs and ``{state: final cost}`` (costs: −log probabilities)."""
    table = np.array(arcs, dtype=np.float64).reshape(-1, 4)
    final = torch.zeros(num_states, dtype=torch.float64)
    for state, cost in finals.items():
        final[state] = float(np.exp(-cost))
    index = table[:, :3].astype(np.int64)
    return DenominatorGraph(torch.from_numpy(index[:, 0].copy()), torch.from_numpy(index[:, 1].copy()),
                            torch.from_numpy(index[:, 2].copy()), torch.from_numpy(np.exp(-table[:, 3])), final, start)


def load_denominator_graph(hclg_path: str | Path, tid2pdf: np.ndarray) -> DenominatorGraph:
    """The HCLG in ``hclg_path`` as a :class:`DenominatorGraph` (:func:`denominator_from_fst`)."""
    from asrflow.kaldi import kfst

    path = Path(hclg_path)
    if not path.is_file():
        raise FileNotFoundError(f"MMI training needs the decoding graph {path} (the graph rule's HCLG.fst)")
    return denominator_from_fst(kfst.StdVectorFst.read(str(path)), tid2pdf)


def denominator_from_fst(hclg, tid2pdf: np.ndarray) -> DenominatorGraph:
    """An HCLG (a decoding graph, or a phone LM's: ``nnet/phone_lm.py``) as a :class:`DenominatorGraph`:
    input labels (transition ids) mapped to pdfs through ``tid2pdf``, output labels dropped, and
    arcs that consume no frame removed (ε-removal of the input-label acceptor)."""
    from asrflow.kaldi import fst_arcs, kfst, map_arcs

    acceptor = map_arcs(hclg, lambda a: kfst.StdArc(a.ilabel, a.ilabel, a.weight, a.nextstate))
    kfst.rmepsilon(acceptor)
    num_states = 0
    finals: dict[int, float] = {}
    states = kfst.StateIterator(acceptor)
    while not states.done:
        state = states.value
        num_states = max(num_states, state + 1)
        cost = float(acceptor.final(state).value)
        if np.isfinite(cost):
            finals[state] = cost
        states.next()
    arcs = [(s, nxt, int(tid2pdf[ilabel]), cost) for s, ilabel, _, cost, nxt in fst_arcs(acceptor)]
    return graph_from_arcs(arcs, finals, acceptor.start, num_states)


def denominator_log_prob(loglikes: torch.Tensor, lengths: torch.Tensor, graph: DenominatorGraph) -> torch.Tensor:
    """``log Σ_paths exp(Σ_t loglikes[b, t, pdf] − cost)`` over ``graph`` for each utterance ``b``.

    ``loglikes`` is ``(B, T, pdfs)``; frames at and after ``lengths[b]`` are ignored. The
    gradient is the denominator's pdf occupancy per frame (forward-backward, :class:`_Forward`).
    """
    return _Forward.apply(loglikes.double(), lengths.to(loglikes.device), graph)


class _Forward(torch.autograd.Function):
    """The forward algorithm with its own backward pass (the arc posteriors), rather than autograd
    through every frame: the forward probabilities are renormalised every frame, so long
    utterances neither underflow nor overflow, and the backward probabilities are scaled by the
    same normalisers, so that Σ_s α_t(s) β_t(s) = 1 at every frame."""

    @staticmethod
    def forward(ctx, loglikes: torch.Tensor, lengths: torch.Tensor, graph: DenominatorGraph) -> torch.Tensor:
        batch, frames, _ = loglikes.shape
        shift = loglikes.amax(dim=2)  # (B, T): each frame's likelihoods rescaled into (0, 1]
        probs = torch.exp(loglikes - shift[:, :, None])
        alphas = torch.zeros(frames + 1, batch, graph.num_states, dtype=torch.float64, device=loglikes.device)
        alphas[0, :, graph.start] = 1.0
        norms = torch.ones(frames, batch, dtype=torch.float64, device=loglikes.device)
        active = torch.arange(frames, device=loglikes.device)[:, None] < lengths[None, :]  # (T, B)
        for t in range(frames):
            arcs = alphas[t][:, graph.src] * graph.weight * probs[:, t, graph.pdf]
            new = torch.zeros_like(alphas[t]).index_add_(1, graph.dst, arcs)
            norm = new.sum(dim=1).clamp_min(1e-300)
            alphas[t + 1] = torch.where(active[t][:, None], new / norm[:, None], alphas[t])
            norms[t] = torch.where(active[t], norm, 1.0)
        final = (alphas[frames] * graph.final).sum(dim=1).clamp_min(1e-300)
        ctx.save_for_backward(probs, alphas, norms, final, active)
        ctx.graph = graph
        return torch.log(norms).sum(dim=0) + (shift * active.T).sum(dim=1) + torch.log(final)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        probs, alphas, norms, final, active = ctx.saved_tensors
        graph: DenominatorGraph = ctx.graph
        batch, frames, num_pdfs = probs.shape
        occupancy = torch.zeros_like(probs)
        beta = graph.final[None, :] / final[:, None]
        for t in range(frames - 1, -1, -1):
            emit = graph.weight * probs[:, t, graph.pdf] * beta[:, graph.dst] / norms[t][:, None]  # (B, A)
            posterior = alphas[t][:, graph.src] * emit  # arc posteriors of frame t; sum to 1
            occupancy[:, t] = torch.zeros(batch, num_pdfs, dtype=torch.float64,
                                          device=probs.device).index_add_(1, graph.pdf, posterior)
            previous = torch.zeros_like(beta).index_add_(1, graph.src, emit)
            beta = torch.where(active[t][:, None], previous, beta)
        occupancy *= active.T[:, :, None]
        return grad[:, None, None] * occupancy, None, None


def mmi(loglikes: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor,
        graph: DenominatorGraph) -> torch.Tensor:
    """MMI of each utterance (up to its numerator's graph cost): denominator minus the aligned
    pdfs' summed ``loglikes``. ``targets`` is ``(B, T)``, −100 on padding."""
    mask = targets != -100
    numerator = loglikes.double().gather(2, targets.clamp_min(0)[:, :, None])[:, :, 0]
    numerator = (numerator * mask).sum(dim=1)
    return denominator_log_prob(loglikes, lengths, graph) - numerator


class MmiObjective:
    """Hybrid training objective: frame cross-entropy + ``weight`` × MMI per frame.

    The cross-entropy term keeps the network's outputs posteriors (and regularises, as in
    lattice-free MMI); the MMI term is computed on ``acoustic_scale`` × (log posterior − log
    prior), the decoder's pseudo log-likelihoods. Called like the objectives of
    :mod:`asrflow.nnet.objectives`; its :class:`LossStats` carry the MMI term in ``parts``.
    """

    def __init__(self, graph: DenominatorGraph, log_priors: torch.Tensor, weight: float,
                 acoustic_scale: float) -> None:
        self.graph, self.log_priors = graph, log_priors.double()
        self.weight, self.acoustic_scale = weight, acoustic_scale

    def __call__(self, logits: torch.Tensor, out_lengths: torch.Tensor,
                 batch: dict) -> tuple[torch.Tensor, LossStats]:
        cross_entropy, stats = frame_cross_entropy(logits, out_lengths, batch)
        device = logits.device
        if self.graph.src.device != device:
            self.graph, self.log_priors = self.graph.to(device), self.log_priors.to(device)
        targets = batch["targets"].to(device)
        loglikes = self.acoustic_scale * (F.log_softmax(logits.double(), dim=-1) - self.log_priors)
        per_frame = mmi(loglikes, out_lengths, targets, self.graph).sum() / max(stats.count, 1)
        loss = cross_entropy + self.weight * per_frame.float()
        return loss, LossStats(loss.detach() * stats.count, stats.count, stats.correct, stats.frames,
                               {"mmi": per_frame.detach().float() * stats.count})
