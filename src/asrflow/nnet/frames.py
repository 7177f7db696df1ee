"""Networks that compute every k-th frame: frame skipping and multi-frame outputs (MFDNN).

A feed-forward hybrid (a DNN over spliced frames, a TDNN or CNN-TDNN) can evaluate its upper
layers at *anchor* frames only, every ``k`` frames, and fill the frames between them:

- **frame skipping** (a decoding option, ``nnet.decode.frame_skip``): a network trained on every frame
  is evaluated at the anchors and each anchor's scores are copied to the next ``k − 1`` frames
  (Vanhoucke et al. 2013);
- **multi-frame outputs** (a network option, ``multi_frame``): the output layer has ``k`` heads,
  head ``j`` of the anchor at ``t`` predicting frame ``t + j``, trained that way (Vanhoucke et al.'s
  MFDNN), so every frame gets its own scores from one forward pass per ``k`` frames.

A DNN evaluates its whole body at the anchors only. A TDNN computes its lower layers on every frame
and, from the lowest layer whose own dilation and every dilation above it are multiples of ``k``,
only the anchors: those layers read nothing else, so they run on the anchor sequence with their
dilations divided by ``k`` and give exactly the anchors' full-rate values away from the utterance's
last frames (Kaldi's chain TDNNs compute their top layers every third frame the same way).
In training, a multi-frame network picks a random phase per batch (which frames are anchors),
so every frame is seen by every head.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.utils import _reverse_repeat_tuple


def decimation_layer(dilations: tuple[int, ...], every: int) -> int:
    """Index of the lowest TDNN layer from which every dilation is a multiple of ``every`` (that layer and those
    above it run on the anchor frames); ``len(dilations)`` when only the output layer can."""
    split = len(dilations)
    while split > 0 and dilations[split - 1] % every == 0:
        split -= 1
    return split


def anchors(frames: int, every: int, phase: int, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """The anchor frames of a sequence of ``frames`` and the (possibly negative) frame the first anchor stands
    for: ``phase − every`` (held at frame 0) when ``phase`` > 0, so the frames before ``phase`` are covered."""
    start = phase - every if phase else 0
    return torch.arange(start, frames, every, device=device).clamp(min=0), start


def anchor_lengths(lengths: torch.Tensor, every: int, start: int) -> torch.Tensor:
    """Anchors that stand for a valid frame of each sequence of ``lengths`` frames (see :func:`anchors`)."""
    return torch.div(lengths - 1 - start, every, rounding_mode="floor") + 1


def at_anchors(y: torch.Tensor, every: int, phase: int, dim: int) -> tuple[torch.Tensor, int]:
    """The anchor frames of ``y`` along ``dim`` (all of them when ``every`` is 1) and their first frame."""
    if every == 1:
        return y, 0
    index, start = anchors(y.shape[dim], every, phase, y.device)
    return y.index_select(dim, index), start


def full_rate(logits: torch.Tensor, every: int, heads: int, start: int, frames: int) -> torch.Tensor:
    """Per-anchor outputs ``(B, A, heads · C)`` as per-frame logits ``(B, frames, C)``: with ``heads`` =
    ``every`` (multi-frame outputs) head ``j`` of an anchor fills its ``j``-th frame; with one head each
    anchor's logits are copied to its ``every`` frames (frame skipping)."""
    if every == 1:
        return logits
    batch, count, width = logits.shape
    if heads == 1:
        per_frame = logits.repeat_interleave(every, dim=1)
    else:
        per_frame = logits.reshape(batch, count * heads, width // heads)
    return per_frame[:, -start: frames - start]


def training_phase(every: int, training: bool) -> int:
    """A random phase in training (every frame gets to be an anchor), 0 in inference."""
    return int(torch.randint(every, ())) if training and every > 1 else 0


def redilate(conv: nn.Conv1d, dilation: int) -> None:
    """Set a 1-D convolution's dilation, with its edge padding (``padding_mode`` kept) to match."""
    pad = dilation * (conv.kernel_size[0] - 1) // 2
    conv.dilation, conv.padding = (dilation,), (pad,)
    conv._reversed_padding_repeated_twice = list(_reverse_repeat_tuple(conv.padding, 2))


def multi_frame_init(state: dict[str, torch.Tensor], heads: int,
                     output: str = "output") -> dict[str, torch.Tensor]:
    """A single-head network's trained weights for a ``heads``-head copy: every head starts as its output layer."""
    out = dict(state)
    for name in (f"{output}.weight", f"{output}.bias"):
        if name in out:
            out[name] = out[name].repeat(heads, *([1] * (out[name].dim() - 1)))
    return out


def frame_skipping(model: nn.Module, every: int) -> nn.Module:
    """``model`` (or each member of an ensemble) set to compute every ``every``-th frame and copy its scores to
    the frames it skips; a network that cannot (recurrent, attention, multi-frame) is a ValueError."""
    members = getattr(model, "members", None)
    for net in list(members) if members is not None else [model]:
        if not hasattr(net, "skip_frames"):
            raise ValueError(f"frame skipping needs DNN or CNN networks; a {type(net).__name__} computes every frame "
                             f"from the whole utterance")
        if getattr(net, "decimated", False):
            raise ValueError("this network outputs one frame in its subsampling already; decode it without frame_skip")
        if net.heads != 1:
            raise ValueError(f"this network has multi-frame outputs ({net.heads} heads): it already runs every "
                             f"{net.heads}th frame; decode it without frame_skip")
        net.skip_frames(every)
    return model
