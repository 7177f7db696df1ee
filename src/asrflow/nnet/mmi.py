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
its own backward pass (forward-backward), one sparse matrix product per frame over a
state-emitting form of the graph (:class:`DenominatorGraph`); its time grows with frames ×
batch × arcs, which suits the word graphs of digit and command corpora (yesno, FSDD). For
larger vocabularies the denominator is a phone n-gram LM instead (``nnet/phone_lm.py``), as in
Kaldi's chain models; both reach this module as an HCLG (:func:`denominator_from_fst`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from asrflow.nnet.numerator import ChainNumerator
from asrflow.nnet.objectives import LossStats, frame_cross_entropy


@dataclass(frozen=True)
class DenominatorGraph:
    """An acceptor in which every state emits one pdf: a frame moves along a weighted arc into a
    state and is scored by that state's pdf (the start state, which no arc enters, emits none).

    One frame of the forward algorithm is then one sparse matrix product and one gather of
    ``S`` scores, rather than a gather and a scatter over every arc. A decoding graph's arcs
    carry the pdfs; :func:`graph_from_arcs` gives each (state, pdf entering it) pair a state of
    its own, which keeps every path and its weight. In an HCLG the arcs into a state mostly read
    one pdf (speechocean762's phone-LM denominator: exactly one for every state), so the graph
    hardly grows.
    """

    into: torch.Tensor  # (S, S) sparse CSR: into[j, i] = exp(−cost) of the arcs i → j, summed
    out_of: torch.Tensor  # (S, S) sparse CSR: its transpose
    pdf: torch.Tensor  # (S,) int64 the pdf each state emits (0 for the start state: never entered)
    final: torch.Tensor  # (S,) float64 exp(−final cost), 0 for non-final states
    start: int
    num_arcs: int

    @property
    def num_states(self) -> int:
        return int(self.final.shape[0])

    def to(self, device: torch.device) -> DenominatorGraph:
        return DenominatorGraph(self.into.to(device), self.out_of.to(device), self.pdf.to(device),
                                self.final.to(device), self.start, self.num_arcs)


def graph_from_arcs(arcs: list[tuple[int, int, int, float]], finals: dict[int, float], start: int,
                    num_states: int) -> DenominatorGraph:
    """A graph from ``(src, dst, pdf, cost)`` arcs and ``{state: final cost}`` (costs: −log probabilities),
    made state-emitting: state 0 is a copy of ``start`` that no arc enters, then one state per distinct
    (destination, pdf) pair of the arcs; every arc leaves each copy of its source state, and each copy
    keeps its original's final cost. States no arc enters, other than the start, are unreachable and dropped."""
    if not 0 <= start < num_states:
        raise ValueError(f"start state {start} is not one of the graph's {num_states} states")
    table = np.array(arcs, dtype=np.float64).reshape(-1, 4)
    src, dst, pdf = (table[:, k].astype(np.int64) for k in range(3))
    weight = np.exp(-table[:, 3])
    width = int(pdf.max(initial=0)) + 1
    pairs, target = np.unique(dst * width + pdf, return_inverse=True)
    original = np.concatenate([[start], pairs // width])  # each new state's original state
    emits = np.concatenate([[0], pairs % width])
    order = np.argsort(original, kind="stable")  # copies of each original, consecutive
    first = np.searchsorted(original[order], src, side="left")
    copies = np.searchsorted(original[order], src, side="right") - first
    arc = np.repeat(np.arange(len(src)), copies)  # one arc per copy of its source
    offset = np.arange(len(arc)) - np.repeat(np.cumsum(copies) - copies, copies)
    new_src, new_dst = order[first[arc] + offset], target[arc] + 1
    size = len(original)
    final_cost = np.array([finals.get(int(s), np.inf) for s in original])

    def matrix(rows: np.ndarray, cols: np.ndarray) -> torch.Tensor:
        index = torch.from_numpy(np.stack([rows, cols]))
        coo = torch.sparse_coo_tensor(index, torch.from_numpy(weight[arc]), (size, size), check_invariants=True)
        with warnings.catch_warnings():  # torch calls its CSR layout beta; its products are what is used here
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return coo.coalesce().to_sparse_csr()

    return DenominatorGraph(matrix(new_dst, new_src), matrix(new_src, new_dst), torch.from_numpy(emits),
                            torch.from_numpy(np.exp(-final_cost)), 0, len(arc))


def load_denominator_graph(hclg_path: str | Path, tid2pdf: np.ndarray) -> DenominatorGraph:
    """The HCLG in ``hclg_path`` as a :class:`DenominatorGraph` (:func:`denominator_from_fst`)."""
    from asrflow.kaldi import kfst

    path = Path(hclg_path)
    if not path.is_file():
        raise FileNotFoundError(f"MMI training needs the decoding graph {path} (the graph rule's HCLG.fst)")
    return denominator_from_fst(kfst.StdVectorFst.read(str(path)), tid2pdf)


def denominator_from_fst(hclg, tid2pdf: np.ndarray) -> DenominatorGraph:
    """An HCLG (a decoding graph, or a phone LM's: ``nnet/phone_lm.py``) as a :class:`DenominatorGraph`, as
    Kaldi's ``CreateDenominatorFst`` makes its ``den.fst``: input labels (transition ids) mapped to pdf + 1,
    output labels dropped, arcs that consume no frame removed (ε-removal), then states that accept the same
    weighted pdf sequences merged (``MinimizeAcceptorNoPush``: minimisation of the acceptor with labels and
    weights, quantised to 1e-5, encoded together, so no weight moves). Paths that read the same pdfs at the
    same costs through different states (context-dependent phones sharing tied states) then become one
    path, counted once, as in Kaldi. The forward-backward's time goes with the arcs (docs/nnet.md)."""
    from asrflow.kaldi import fst_arcs, kfst, map_arcs

    def pdf_arc(a):
        label = int(tid2pdf[a.ilabel]) + 1 if a.ilabel else 0
        return kfst.StdArc(label, label, a.weight, a.nextstate)

    acceptor = map_arcs(hclg, pdf_arc)
    kfst.rmepsilon(acceptor)
    kfst.minimize_encoded(acceptor, delta=1e-5)
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
    arcs = [(s, nxt, ilabel - 1, cost) for s, ilabel, _, cost, nxt in fst_arcs(acceptor)]
    return graph_from_arcs(arcs, finals, acceptor.start, num_states)


def denominator_log_prob(loglikes: torch.Tensor, lengths: torch.Tensor, graph: DenominatorGraph) -> torch.Tensor:
    """``log Σ_paths exp(Σ_t loglikes[b, t, pdf] − cost)`` over ``graph`` for each utterance ``b``.

    ``loglikes`` is ``(B, T, pdfs)``; frames at and after ``lengths[b]`` are ignored. The
    gradient is the denominator's pdf occupancy per frame (forward-backward, :class:`_Forward`).
    """
    return _Forward.apply(loglikes.double(), lengths.to(loglikes.device), graph)


class _Forward(torch.autograd.Function):
    """The forward algorithm with its own backward pass (the state posteriors), rather than autograd
    through every frame: the forward probabilities are renormalised every frame, so long
    utterances neither underflow nor overflow, and the backward probabilities are scaled by the
    same normalisers, so that Σ_s α_t(s) β_t(s) = 1 at every frame. States and the batch are laid
    out (S, B): one frame is ``into @ α`` times the states' scores."""

    @staticmethod
    def forward(ctx, loglikes: torch.Tensor, lengths: torch.Tensor, graph: DenominatorGraph) -> torch.Tensor:
        batch, frames, _ = loglikes.shape
        shift = loglikes.amax(dim=2)  # (B, T): each frame's likelihoods rescaled into (0, 1]
        probs = torch.exp(loglikes - shift[:, :, None]).permute(1, 2, 0).contiguous()  # (T, pdfs, B)
        alphas = torch.zeros(frames + 1, graph.num_states, batch, dtype=torch.float64, device=loglikes.device)
        alphas[0, graph.start] = 1.0
        norms = torch.ones(frames, batch, dtype=torch.float64, device=loglikes.device)
        active = torch.arange(frames, device=loglikes.device)[:, None] < lengths[None, :]  # (T, B)
        for t in range(frames):
            new = torch.sparse.mm(graph.into, alphas[t]) * probs[t].index_select(0, graph.pdf)
            norm = new.sum(dim=0).clamp_min(1e-300)
            alphas[t + 1] = torch.where(active[t], new / norm, alphas[t])
            norms[t] = torch.where(active[t], norm, 1.0)
        final = (alphas[frames] * graph.final[:, None]).sum(dim=0).clamp_min(1e-300)
        ctx.save_for_backward(probs, alphas, norms, final, active)
        ctx.graph = graph
        return torch.log(norms).sum(dim=0) + (shift * active.T).sum(dim=1) + torch.log(final)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        probs, alphas, norms, final, active = ctx.saved_tensors
        graph: DenominatorGraph = ctx.graph
        frames = probs.shape[0]
        occupancy = torch.zeros_like(probs)  # (T, pdfs, B)
        beta = graph.final[:, None] / final[None, :]  # (S, B)
        for t in range(frames - 1, -1, -1):
            # the states' posteriors after frame t (they sum to 1), gathered by the pdf each emits
            occupancy[t].index_add_(0, graph.pdf, alphas[t + 1] * beta)
            emitted = probs[t].index_select(0, graph.pdf) * beta / norms[t]
            beta = torch.where(active[t], torch.sparse.mm(graph.out_of, emitted), beta)
        occupancy *= active[:, None, :]
        return grad[:, None, None] * occupancy.permute(2, 0, 1), None, None


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

    The cross-entropy term regularises, as in lattice-free MMI; read from the network's output
    (``separate`` false) it also keeps that output posteriors, read from a second output layer
    (``separate``: :class:`~asrflow.nnet.models.CrossEntropyOutput`, which :meth:`attach` finds) it
    leaves the output MMI and the decoder read to MMI alone, as Kaldi's chain models do. The MMI
    term is computed on ``acoustic_scale`` × (log posterior − log prior), the decoder's pseudo
    log-likelihoods. Its numerator is the aligned pdf sequence, or with a ``numerator``
    (:class:`~asrflow.nnet.numerator.ChainNumerator`: a chain network's alignment with slack) the
    sum over the timings it allows, whose posteriors are then the cross-entropy's soft targets too.
    Called like the objectives of :mod:`asrflow.nnet.objectives`; its :class:`LossStats` carry the
    MMI term in ``parts``.
    """

    def __init__(self, graph: DenominatorGraph, log_priors: torch.Tensor, weight: float,
                 acoustic_scale: float, separate: bool = False, numerator: ChainNumerator | None = None) -> None:
        self.graph, self.log_priors = graph, log_priors.double()
        self.weight, self.acoustic_scale = weight, acoustic_scale
        self.separate, self.xent_output = separate, None
        self.numerator = numerator

    def attach(self, model: torch.nn.Module) -> None:
        """Read the cross-entropy from ``model``'s second output layer (with ``separate``)."""
        from asrflow.nnet.models import CrossEntropyOutput

        if self.separate:
            if not isinstance(getattr(model, "output", None), CrossEntropyOutput):
                raise ValueError(f"MMI with a separate cross-entropy output needs a network built with one "
                                 f"(xent_output), not a {type(model).__name__}")
            self.xent_output = model.output

    def cross_entropy_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits the cross-entropy term reads: the network's, or its second output layer's."""
        if not self.separate:
            return logits
        xent = self.xent_output.xent_logits if self.xent_output is not None else None
        if xent is None or xent.shape != logits.shape:
            raise ValueError("the separate cross-entropy output gave no logits of the network's shape "
                             f"({None if xent is None else tuple(xent.shape)} against {tuple(logits.shape)}): "
                             "attach() the network, one whose output layer gives its per-frame outputs")
        return xent

    def __call__(self, logits: torch.Tensor, out_lengths: torch.Tensor,
                 batch: dict) -> tuple[torch.Tensor, LossStats]:
        device = logits.device
        if self.graph.pdf.device != device:
            self.graph, self.log_priors = self.graph.to(device), self.log_priors.to(device)
        loglikes = self.acoustic_scale * (F.log_softmax(logits.double(), dim=-1) - self.log_priors)
        if self.numerator is None:
            cross_entropy, stats = frame_cross_entropy(self.cross_entropy_logits(logits), out_lengths, batch)
            value = mmi(loglikes, out_lengths, batch["targets"].to(device), self.graph).sum()
        else:  # the numerator's posteriors: its gradient, and the cross-entropy's targets
            numerator, posteriors = self.numerator(loglikes, out_lengths, batch["utts"])
            cross_entropy, stats = frame_cross_entropy(self.cross_entropy_logits(logits), out_lengths, batch,
                                                       posteriors)
            value = (denominator_log_prob(loglikes, out_lengths, self.graph).sum() - numerator.sum()
                     - (posteriors * (loglikes - loglikes.detach())).sum())  # the numerator's gradient, value 0
        per_frame = value / max(stats.count, 1)
        loss = cross_entropy + self.weight * per_frame.float()
        return loss, LossStats(loss.detach() * stats.count, stats.count, stats.correct, stats.frames,
                               {"mmi": per_frame.detach().float() * stats.count})


def denominator_speed(graph: DenominatorGraph, num_pdfs: int, batch: int, frames: int,
                      repeats: int = 3) -> dict[str, float]:
    """Seconds of one forward and one backward pass of the denominator over ``batch`` utterances of
    ``frames`` frames of random log-likelihoods (the best of ``repeats``), and milliseconds per frame
    of the batch, both passes together."""
    import time

    generator = torch.Generator().manual_seed(0)
    loglikes = torch.randn(batch, frames, num_pdfs, generator=generator, dtype=torch.float64)
    lengths = torch.full((batch,), frames)
    forward, backward = [], []
    for _ in range(repeats):
        x = loglikes.clone().requires_grad_()
        start = time.perf_counter()
        value = denominator_log_prob(x, lengths, graph).sum()
        middle = time.perf_counter()
        value.backward()
        forward.append(middle - start)
        backward.append(time.perf_counter() - middle)
    best = min(f + b for f, b in zip(forward, backward))
    return {"forward_s": round(min(forward), 4), "backward_s": round(min(backward), 4),
            "ms_per_frame": round(1000 * best / frames, 3)}
