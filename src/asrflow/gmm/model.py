"""A GMM-HMM acoustic model: topology, tree, transition model and diagonal GMMs.

Saved as ``final.mdl.pkl`` (the wheels' own pickling, which round-trips exactly) plus the
tree in Kaldi's binary format (``tree``), readable by Kaldi's tools.
"""

from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asrflow.kaldi import khg


@dataclass
class GmmModel:
    """The four Kaldi objects that make an acoustic model."""

    topo: object
    tree: object
    tm: object
    am: object

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "final.mdl.pkl.tmp"
        tmp.write_bytes(self.to_bytes())
        tmp.replace(folder / "final.mdl.pkl")
        self.tree.write(True, str(folder / "tree"))

    @classmethod
    def load(cls, folder: str | Path) -> GmmModel:
        return cls.from_bytes((Path(folder) / "final.mdl.pkl").read_bytes())

    def to_bytes(self) -> bytes:
        return pickle.dumps({"topo": self.topo, "tree": self.tree, "tm": self.tm, "am": self.am})

    @classmethod
    def from_bytes(cls, blob: bytes) -> GmmModel:
        d = pickle.loads(blob)
        return cls(d["topo"], d["tree"], d["tm"], d["am"])

    @functools.cached_property
    def tid2pdf(self) -> np.ndarray:
        """pdf id of each transition id (index 0 unused)."""
        return np.asarray(self.tm.transition_id_to_pdf_array(), dtype=np.int64)

    @property
    def self_loop_scale(self) -> float:
        """The scale of its self-loop probabilities in a decoding graph: 1.0 for a chain topology (a phone may
        last one frame; its network is decoded at acoustic scale about 1), else Kaldi's usual 0.1 (the
        acoustic scale the GMMs and hybrids decode near), as ``mkgraph.sh --self-loop-scale`` sets them."""
        return 1.0 if min(self.topo.min_length(p) for p in self.topo.phones) == 1 else 0.1

    @functools.cached_property
    def transition_states(self) -> np.ndarray:
        """``(phone, hmm_state, forward pdf, self-loop pdf)`` of each transition state (row ``s − 1`` for state
        ``s``), from the model's ``<Triples>`` (one pdf per HMM state) or ``<Tuples>`` (a chain topology's
        forward and self-loop pdf classes)."""
        text = str(self.tm)
        for name, width in (("Triples", 3), ("Tuples", 4)):
            if f"<{name}>" in text:
                body = text[text.index(f"<{name}>") + len(name) + 2: text.index(f"</{name}>")].split()
                table = np.asarray(body[1:], dtype=np.int64).reshape(-1, width)
                return table if width == 4 else np.concatenate([table, table[:, 2:]], axis=1)
        raise ValueError("the transition model lists neither <Triples> nor <Tuples>")

    @functools.cached_property
    def self_loops(self) -> np.ndarray:
        """Whether each transition id is a self-loop (index 0 unused, False)."""
        return np.array([False] + [self.tm.is_self_loop(t) for t in range(1, self.tm.num_transition_ids + 1)])

    @functools.cached_property
    def tid_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """``(phone, hmm_state)`` of each transition id (index 0 unused)."""
        states = np.asarray(self.tm.id2state, dtype=np.int64)
        phone = np.zeros(len(states), dtype=np.int64)
        hmm_state = np.zeros(len(states), dtype=np.int64)
        phone[1:] = self.transition_states[states[1:] - 1, 0]
        hmm_state[1:] = self.transition_states[states[1:] - 1, 1]
        return phone, hmm_state

    @functools.cached_property
    def _stacked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every Gaussian's ``μ/σ²``, ``−½/σ²`` and log constant (weight included), in pdf order, and the pdf
        offsets (:meth:`gaussian_offsets`)."""
        pdfs = [self.am.get_pdf(p) for p in range(self.am.num_pdfs)]
        means_invvars = np.concatenate([np.asarray(g.means_invvars, dtype=np.float32) for g in pdfs])
        half_invvars = -0.5 * np.concatenate([np.asarray(g.inv_vars, dtype=np.float32) for g in pdfs])
        gconsts = np.concatenate([np.asarray(g.gconsts, dtype=np.float32) for g in pdfs])
        return means_invvars, half_invvars, gconsts, self.gaussian_offsets()

    def pdf_loglikes(self, feats: np.ndarray, block: int = 256) -> np.ndarray:
        """Log-likelihood of every frame under every pdf, (frames, pdfs): what Kaldi's GMM decodable
        computes for the pdfs a search visits, here for all of them by matrix products, ``block`` frames
        at a time (the per-Gaussian scores of a block are the peak memory)."""
        means_invvars, half_invvars, gconsts, offsets = self._stacked
        x = np.asarray(feats, dtype=np.float32)
        out = np.empty((x.shape[0], len(offsets) - 1), dtype=np.float32)
        for start in range(0, x.shape[0], block):
            xb = x[start:start + block]
            per_gauss = xb @ means_invvars.T + (xb * xb) @ half_invvars.T + gconsts
            top = np.maximum.reduceat(per_gauss, offsets[:-1], axis=1)
            per_gauss -= np.repeat(top, np.diff(offsets), axis=1)
            np.exp(per_gauss, out=per_gauss)
            out[start:start + block] = np.log(np.add.reduceat(per_gauss, offsets[:-1], axis=1)) + top
        return out

    def gaussian_offsets(self) -> np.ndarray:
        """Start of each pdf's Gaussians in a flat per-Gaussian array (length num_pdfs + 1)."""
        counts = [self.am.num_gauss_in_pdf(p) for p in range(self.am.num_pdfs)]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def single_gaussian(mean: np.ndarray, var: np.ndarray):
    """A one-component DiagGmm."""
    gmm = khg.DiagGmm(nmix=1, dim=mean.shape[0])
    gmm.set_weights(np.ones(1, dtype=np.float32))
    gmm.set_means(mean[None].astype(np.float32))
    gmm.set_invvars((1.0 / var)[None].astype(np.float32))
    gmm.compute_gconsts()
    return gmm


def read_topology(path: str | Path):
    """The HMM topology in Kaldi's text format in file ``path`` (a lang's ``topo``)."""
    return topology_from_text(Path(path).read_text())


def topology_from_text(text: str):
    """An HMM topology from Kaldi's text format."""
    topo = khg.HmmTopology()
    topo.read(text)
    return topo


def init_mono(topo, mean: np.ndarray, var: np.ndarray) -> GmmModel:
    """``gmm-init-mono``: monophone tree, transition model, one global Gaussian per pdf."""
    tree = khg.monophone_context_dependency(phones=topo.phones,
                                            phone2num_pdf_classes=topo.get_phone_to_num_pdf_classes())
    tm = khg.TransitionModel(ctx_dep=tree, hmm_topo=topo)
    am = khg.AmDiagGmm()
    gmm = single_gaussian(mean, var)
    for _ in range(tree.num_pdfs):
        am.add_pdf(gmm)
    return GmmModel(topo, tree, tm, am)


def tree_from_bytes(blob: bytes):
    """A ContextDependency from Kaldi's binary tree format (with or without the ``\\0B`` header)."""
    if blob[:2] == b"\x00B":
        blob = blob[2:]
    tree = khg.ContextDependency.__new__(khg.ContextDependency)
    tree.__setstate__((np.frombuffer(blob, dtype=np.int8).tolist(),))
    return tree


def init_from_tree(topo, tree, pdf_count: np.ndarray, pdf_sum: np.ndarray, pdf_sumsq: np.ndarray,
                   var_floor: float = 0.01) -> GmmModel:
    """``gmm-init-model``: one Gaussian per tree leaf from its pooled statistics.

    A leaf without data (a phone never seen) gets the global mean and variance.
    """
    tm = khg.TransitionModel(ctx_dep=tree, hmm_topo=topo)
    total = pdf_count.sum()
    g_mean = pdf_sum.sum(0) / total
    g_var = np.maximum(pdf_sumsq.sum(0) / total - g_mean**2, var_floor)
    am = khg.AmDiagGmm()
    for pdf in range(tree.num_pdfs):
        if pdf_count[pdf] > 0:
            mean = pdf_sum[pdf] / pdf_count[pdf]
            var = np.maximum(pdf_sumsq[pdf] / pdf_count[pdf] - mean**2, var_floor)
        else:
            mean, var = g_mean, g_var
        am.add_pdf(single_gaussian(mean, var))
    return GmmModel(topo, tree, tm, am)
