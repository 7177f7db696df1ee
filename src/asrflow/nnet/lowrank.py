"""Low-rank factorisation of a trained network (Xue et al. 2013; Kaldi nnet3's ``apply-svd``).

Each weight matrix ``W`` (out × in; a 1-D convolution's kernel flattened to out × in·k) is
replaced by its truncated singular value decomposition, two thinner layers ``B · A`` with
``B = U_r √Σ_r`` (out × r) and ``A = √Σ_r V_rᵀ`` (r × in): the best rank-r approximation of
``W`` (Eckart–Young), with ``r · (in + out)`` weights instead of ``in · out``. The first layer
keeps the original's kernel, dilation and padding, the second is a 1 × 1 layer with the bias.
A network is factorised from another's trained weights (``init``), then fine-tuned.

Ranks are chosen per layer, by kept ``energy`` (the smallest rank whose squared singular
values sum to that fraction of the total) or by a parameter budget (``keep``: each layer keeps
that fraction of its weights). A layer whose rank would save nothing stays whole.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class LowRank(nn.Module):
    """A linear layer or 1-D convolution as two thinner ones: ``first`` (the kernel, to ``rank``
    channels, no bias) then ``second`` (1 × 1, to the outputs, with the bias)."""

    def __init__(self, layer: nn.Linear | nn.Conv1d, rank: int) -> None:
        super().__init__()
        if isinstance(layer, nn.Linear):
            self.first: nn.Module = nn.Linear(layer.in_features, rank, bias=False)
            self.second: nn.Module = nn.Linear(rank, layer.out_features, bias=layer.bias is not None)
        else:
            self.first = nn.Conv1d(layer.in_channels, rank, layer.kernel_size[0], stride=layer.stride,
                                   padding=layer.padding, dilation=layer.dilation, bias=False,
                                   padding_mode=layer.padding_mode)
            self.second = nn.Conv1d(rank, layer.out_channels, 1, bias=layer.bias is not None)
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def factorisable(model: nn.Module) -> dict[str, nn.Linear | nn.Conv1d]:
    """The layers a factorisation may replace, by name: every linear layer and 1-D convolution."""
    return {name: module for name, module in model.named_modules()
            if type(module) in (nn.Linear, nn.Conv1d) and getattr(module, "groups", 1) == 1}


def named_layers(model: nn.Module, names) -> dict[str, nn.Linear | nn.Conv1d]:
    """The factorisable layers of ``model`` with these names; an unknown or unfactorisable name is a ValueError."""
    layers = factorisable(model)
    unknown = sorted(set(names) - set(layers))
    if unknown:
        raise ValueError(f"no linear layer or 1-D convolution named {', '.join(unknown)} in this network")
    return {name: layers[name] for name in names}


def _matrix(weight: torch.Tensor) -> torch.Tensor:
    """A layer's weight as an out × in matrix (a convolution's kernel taps side by side)."""
    return weight.detach().float().reshape(weight.shape[0], -1)


def layer_rank(weight: torch.Tensor, *, energy: float | None = None, keep: float | None = None) -> int | None:
    """The rank to keep of one layer's ``weight`` by ``energy`` or ``keep`` (exactly one), or None where
    a factorisation of that rank would have as many weights as the layer (it stays whole)."""
    if (energy is None) == (keep is None):
        raise ValueError("give exactly one of energy and keep")
    w = _matrix(weight)
    out_dim, in_dim = w.shape
    if keep is not None:
        rank = max(1, int(keep * out_dim * in_dim / (out_dim + in_dim)))
    else:
        squared = torch.linalg.svdvals(w.double()) ** 2
        kept = torch.cumsum(squared, 0) / squared.sum().clamp(min=1e-30)
        rank = int(torch.searchsorted(kept, torch.tensor(energy, dtype=kept.dtype) - 1e-12)) + 1
    return rank if rank * (out_dim + in_dim) < out_dim * in_dim else None


def choose_ranks(model: nn.Module, state: dict[str, torch.Tensor], *, energy: float | None = None,
                 keep: float | None = None) -> dict[str, int]:
    """The rank of every factorisable layer of ``model`` (the network the weights ``state`` are for)
    that a factorisation shrinks, by kept ``energy`` or a fraction ``keep`` of its weights."""
    ranks = {}
    for name in factorisable(model):
        rank = layer_rank(state[f"{name}.weight"], energy=energy, keep=keep)
        if rank is not None:
            ranks[name] = rank
    return ranks


def factorise(model: nn.Module, ranks: dict[str, int]) -> nn.Module:
    """``model`` with each layer named in ``ranks`` replaced, in place, by an (untrained) :class:`LowRank`
    of that rank; an unknown or unfactorisable name is a ValueError."""
    layers = named_layers(model, ranks)
    for name, rank in ranks.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LowRank(layers[name], rank))
    return model


def factorised_state(state: dict[str, torch.Tensor], ranks: dict[str, int]) -> dict[str, torch.Tensor]:
    """Trained weights ``state`` with each layer in ``ranks`` replaced by its truncated SVD, for a model
    built with :func:`factorise` (``<name>.first.weight``, ``<name>.second.weight`` and ``.bias``)."""
    out = {k: v for k, v in state.items() if k.rpartition(".")[0] not in ranks}
    for name, rank in ranks.items():
        weight = state[f"{name}.weight"]
        u, s, vh = torch.linalg.svd(_matrix(weight).double(), full_matrices=False)
        root = s[:rank].sqrt()
        first = (root.unsqueeze(1) * vh[:rank]).reshape(rank, *weight.shape[1:])
        second = u[:, :rank] * root.unsqueeze(0)
        if weight.dim() == 3:
            second = second.unsqueeze(2)
        out[f"{name}.first.weight"] = first.to(weight.dtype)
        out[f"{name}.second.weight"] = second.to(weight.dtype)
        if f"{name}.bias" in state:
            out[f"{name}.second.bias"] = state[f"{name}.bias"]
    return out


def factorised_init(init: dict[str, Any], model: nn.Module, low_rank: dict[str, float]) -> tuple[dict[str, Any],
                                                                                                  dict[str, int]]:
    """A trained network's ``final.pt`` content ``init`` (for ``model``'s shape) with its layers factorised
    by ``low_rank`` (``energy`` or ``keep``), and the ranks chosen."""
    ranks = choose_ranks(model, init["model"], **low_rank)
    return {**init, "model": factorised_state(init["model"], ranks)}, ranks
