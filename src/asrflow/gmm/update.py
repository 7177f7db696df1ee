"""The M-step on the driver: sum shard statistics, re-estimate, and grow the mixtures.

Statistics are summed in shard order, and Gaussian splitting uses a seeded numpy RNG
(the wheels' ``split_by_count`` perturbs with an RNG that cannot be seeded), so the
trained model is the same however many workers ran the E-step, or if one died.
"""

from __future__ import annotations

import numpy as np

from asrflow.gmm.alignments import Written
from asrflow.gmm.estep import EStepResult
from asrflow.gmm.model import GmmModel
from asrflow.kaldi import khg, khg_ext


def merge_results(left: EStepResult, right: EStepResult) -> EStepResult:
    """Two shards' (or sums') statistics added, their alignments and failures together (left's first): the
    combination :func:`asrflow.cluster.run_reduced` applies on the workers."""
    alignments = None
    if isinstance(left.alignments, Written) or isinstance(right.alignments, Written):
        alignments = (left.alignments or Written()) + (right.alignments or Written())  # indexes: a path a shard
    elif left.alignments is not None or right.alignments is not None:
        alignments = {**(left.alignments or {}), **(right.alignments or {})}
    return EStepResult(left.occ + right.occ, left.x + right.x, left.x2 + right.x2, left.trans + right.trans,
                       left.like + right.like, left.frames + right.frames, alignments, left.failed + right.failed,
                       left.retried + right.retried, left.align_like + right.align_like,
                       left.seconds + right.seconds, left.aligned_frames + right.aligned_frames)


def split_gaussians(model: GmmModel, pdf_occs: np.ndarray, target: int, rng: np.random.Generator,
                    power: float = 0.25, perturb_factor: float = 0.01, min_count: float = 20.0) -> None:
    """``AmDiagGmm::SplitByCount`` with a seeded RNG (Kaldi's allocation, then ``DiagGmm::Split``).

    The per-pdf targets (occupancy^power allocation) come from the library on a copy; the
    splitting itself — halve the heaviest component, move the two means ± perturb·σ·N(0,1) —
    is done here so that it is reproducible.
    """
    probe = khg.AmDiagGmm()
    probe.copy_from_am_diag_gmm(model.am)
    probe.split_by_count(np.asarray(pdf_occs, dtype=np.float32), int(target), perturb_factor, power, min_count)
    for pdf in range(model.am.num_pdfs):
        goal = probe.num_gauss_in_pdf(pdf)
        gmm = model.am.get_pdf(pdf)
        n = gmm.num_gauss
        if goal <= n:
            continue
        w = np.zeros(goal)
        w[:n] = gmm.weights
        iv = np.zeros((goal, gmm.dim))
        iv[:n] = gmm.inv_vars
        mi = np.zeros((goal, gmm.dim))
        mi[:n] = gmm.means_invvars
        while n < goal:
            k = int(np.argmax(w[:n]))
            w[k] /= 2
            w[n] = w[k]
            r = rng.standard_normal(gmm.dim) * np.sqrt(iv[k])
            iv[n] = iv[k]
            mi[n] = mi[k] + perturb_factor * r
            mi[k] -= perturb_factor * r
            n += 1
        new = khg.DiagGmm(nmix=goal, dim=gmm.dim)
        new.set_weights(w.astype(np.float32))
        new.set_invvars_and_means(iv.astype(np.float32), (mi / iv).astype(np.float32))
        new.compute_gconsts()
        gmm.copy_from_diag_gmm(new)


def m_step(model: GmmModel, totals: EStepResult, min_gaussian_occupancy: float = 10.0) -> tuple[float, float]:
    """``gmm-est`` without mixing up: transition and GMM maximum-likelihood updates.

    Returns ``(transition objective improvement, GMM objective improvement)`` per frame.
    """
    t_impr, t_count = model.tm.mle_update(totals.trans, khg.MleTransitionUpdateConfig())
    opts = khg.MleDiagGmmOptions(min_gaussian_occupancy=min_gaussian_occupancy)
    flags = int(khg.GmmUpdateFlags.kGmmAll)
    offsets = model.gaussian_offsets()
    g_impr = g_count = 0.0
    for pdf in range(model.am.num_pdfs):
        gmm = model.am.get_pdf(pdf)
        acc = khg.AccumDiagGmm(gmm, flags)
        for i, g in enumerate(range(offsets[pdf], offsets[pdf + 1])):
            acc.add_stats_for_component(i, float(totals.occ[g]), totals.x[g], totals.x2[g])
        if totals.occ[offsets[pdf]: offsets[pdf + 1]].sum() <= 0:
            continue  # no data for this pdf: keep it as it is
        impr, count, _, _, _ = khg_ext.mle_diag_gmm_update(opts, acc, flags, gmm)
        g_impr += impr
        g_count += count
    return (t_impr / t_count if t_count else 0.0), (g_impr / g_count if g_count else 0.0)


def pdf_occupancies(model: GmmModel, totals: EStepResult) -> np.ndarray:
    """Occupancy of each pdf (sum over its Gaussians)."""
    offsets = model.gaussian_offsets()
    return np.add.reduceat(totals.occ, offsets[:-1]) if len(totals.occ) else np.zeros(model.am.num_pdfs)
