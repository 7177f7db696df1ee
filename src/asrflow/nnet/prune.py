"""Magnitude pruning of a trained network (Han et al. 2015): the smallest weights set to zero, then
fine-tuning with them held at zero.

Each linear layer and 1-D convolution keeps the largest ``1 − fraction`` of its weights by
magnitude (biases are kept). The layer's weight becomes ``weight_orig × weight_mask``
(:mod:`torch.nn.utils.prune`), so the optimiser updates only the kept weights. ``final.pt``
stores each pruned layer compactly (:func:`packed`): its kept weights and a bit per weight
saying which are kept. A network is pruned from another's trained weights (``init``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from asrflow.nnet.lowrank import factorisable, named_layers


def masked(model: nn.Module, layers: list[str]) -> nn.Module:
    """``model`` with each named layer's weight held as ``weight_orig × weight_mask`` (the mask all ones
    until weights are loaded into it); an unknown or unprunable name is a ValueError."""
    for module in named_layers(model, layers).values():
        torch_prune.identity(module, "weight")
    return model


def pruned_state(state: dict[str, torch.Tensor], layers: list[str], fraction: float) -> dict[str, torch.Tensor]:
    """Trained weights ``state`` with, in each named layer, the ``fraction`` of weights smallest in magnitude
    zeroed, as a :func:`masked` network loads them (``<name>.weight_orig`` and ``<name>.weight_mask``)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the pruned fraction must be between 0 and 1, not {fraction}")
    out = dict(state)
    for name in layers:
        weight = out.pop(f"{name}.weight")
        drop = int(fraction * weight.numel())
        mask = torch.ones_like(weight)
        if drop:
            order = weight.abs().flatten().argsort()  # ties broken by position: exactly ``drop`` weights go
            mask.view(-1)[order[:drop]] = 0.0
        out[f"{name}.weight_orig"] = weight * mask
        out[f"{name}.weight_mask"] = mask
    return out


def pruned_init(init: dict[str, Any], model: nn.Module, fraction: float) -> tuple[dict[str, Any], list[str]]:
    """A trained network's ``final.pt`` content ``init`` (for ``model``'s shape) with the ``fraction`` of smallest
    weights of every linear layer and 1-D convolution zeroed, and the names of those layers."""
    layers = list(factorisable(model))
    return {**init, "model": pruned_state(init["model"], layers, fraction)}, layers



def packed(state: dict[str, torch.Tensor], layers: list[str]) -> dict[str, torch.Tensor]:
    """``state`` of a pruned network with each named layer's ``weight_orig`` and ``weight_mask`` stored as
    ``weight_kept`` (the kept weights, in order), ``weight_bits`` (the mask, a bit per weight) and
    ``weight_shape``: 4 bytes per kept weight and 1/8 byte per weight instead of 8 bytes per weight."""
    out = dict(state)
    for name in layers:
        weight, mask = out.pop(f"{name}.weight_orig"), out.pop(f"{name}.weight_mask").bool()
        out[f"{name}.weight_kept"] = weight[mask].clone()
        out[f"{name}.weight_bits"] = torch.from_numpy(np.packbits(mask.flatten().numpy()))
        out[f"{name}.weight_shape"] = torch.tensor(weight.shape)
    return out


def unpacked(state: dict[str, torch.Tensor], layers: list[str]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`packed` (layers already unpacked are left as they are): the state a
    :func:`masked` network loads."""
    out = dict(state)
    for name in layers:
        if f"{name}.weight_kept" not in out:
            continue
        kept, bits = out.pop(f"{name}.weight_kept"), out.pop(f"{name}.weight_bits")
        shape = tuple(int(n) for n in out.pop(f"{name}.weight_shape"))
        count = int(np.prod(shape))
        mask = torch.from_numpy(np.unpackbits(bits.numpy(), count=count).astype(bool)).reshape(shape)
        weight = torch.zeros(shape, dtype=kept.dtype)
        weight[mask] = kept
        out[f"{name}.weight_orig"], out[f"{name}.weight_mask"] = weight, mask.to(kept.dtype)
    return out


def sparse_speed(rows: int, cols: int, frames: int, fractions: list[float], repeats: int = 10) -> list[dict[str, Any]]:
    """Whether a pruned layer runs faster sparse: one thread, a ``rows`` × ``cols`` weight with each ``fraction``
    of its smallest weights zeroed, times ``frames`` input frames, as a dense matrix product and as a CSR sparse
    one (:func:`torch.Tensor.to_sparse_csr`); one row per fraction with the milliseconds of each (best of
    ``repeats``) and their ratio."""
    import time
    import warnings

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(cols, frames, generator=generator)
    out = []
    for fraction in fractions:
        weight = torch.randn(rows, cols, generator=generator)
        drop = int(fraction * weight.numel())
        if drop:
            weight.view(-1)[weight.abs().flatten().argsort()[:drop]] = 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch calls its CSR support beta
            sparse = weight.to_sparse_csr()
        best = {}
        for name, matrix in (("dense", weight), ("sparse", sparse)):
            times = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                matrix @ x
                times.append(time.perf_counter() - start)
            best[name] = min(times[1:])
        out.append({"rows": rows, "cols": cols, "frames": frames, "fraction": fraction, "threads": 1,
                    "dense_ms": round(1000 * best["dense"], 4), "sparse_ms": round(1000 * best["sparse"], 4),
                    "sparse_over_dense": round(best["sparse"] / best["dense"], 2)})
    return out
