"""Acoustic models: DNN over spliced frames, (B)LSTM with optional projection, CNN + TDNN, Conformer, and
ensembles of them.

One factory, :func:`build_model`, builds every variant from a config dict, so a new model
is a config, not a copy of the trainer. Every model maps features ``(batch, frames, dim)``
and their lengths to per-frame logits ``(batch, frames', classes)`` and output lengths;
none subsamples unless asked (``subsampling`` on the CNN), so hybrid frame targets align.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from asrflow.config.sizes import network_config
from asrflow.nnet.frames import anchor_lengths, at_anchors, decimation_layer, full_rate, redilate, training_phase
from asrflow.nnet.lowrank import LowRank, factorise
from asrflow.nnet.prune import masked


def splice(x: torch.Tensor, context: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Stack each frame with ``context`` frames either side: (B, T, D) → (B, T, D·(2c+1)).

    Frames past either edge repeat the first or last *valid* frame of each sequence (its
    length), so a padded batch gives the same result as each utterance alone.
    """
    if context == 0:
        return x
    batch, frames, dim = x.shape
    last = (lengths.to(x.device) - 1) if lengths is not None else torch.full((batch,), frames - 1, device=x.device)
    # each sequence padded with its edge frames (one gather of T + 2c rows), then a window of 2c + 1 frames slid
    # over it: a view, whose backward sums each frame's gradients over the windows it is in
    source = torch.arange(-context, frames + context, device=x.device).clamp(min=0)
    index = torch.minimum(source.unsqueeze(0), last.unsqueeze(1))  # (B, T + 2c)
    padded = torch.gather(x, 1, index.unsqueeze(2).expand(-1, -1, dim))
    return padded.unfold(1, 2 * context + 1, 1).transpose(2, 3).reshape(batch, frames, dim * (2 * context + 1))


class Unit(nn.Module):
    """One layer of a feed-forward network on its own (a stage of pipelined training is a run of them):
    ``(B, T, D)`` features or activations and the lengths in, ``(B, T, D')`` out, at the full frame rate.
    ``kind``: ``splice`` (the DNN's context), ``front`` (the CNN's convolutions), ``tdnn`` (one TDNN layer)
    or ``layer`` (any frame-wise module)."""

    def __init__(self, kind: str, layer: nn.Module | None = None, context: int = 0,
                 strides: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.kind, self.layer, self.context, self.strides = kind, layer, context, strides

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.kind == "splice":
            return splice(x, self.context, lengths)
        if self.kind == "front":
            return run_front_end(self.layer, self.strides, x, lengths)[0]
        if self.kind == "tdnn":
            return hold_last(self.layer(x.transpose(1, 2)), lengths, dim=2).transpose(1, 2)
        return self.layer(x)


class CrossEntropyOutput(nn.Linear):
    """A hybrid's output layer with a second linear output beside it over the same input, for the cross-entropy
    term of chain training (Kaldi's ``output-xent``): the first output serves MMI and the decoder, free of the
    frame posteriors the cross-entropy asks for; the second serves the cross-entropy alone, and each forward pass
    leaves its logits in :attr:`xent_logits` for the objective (``nnet/mmi.py``). The network stage writes
    ``final.pt`` without it: decoding never reads it."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        self.xent = nn.Linear(in_features, out_features)
        self.xent_logits: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.xent_logits = self.xent(x)
        return super().forward(x)


def with_cross_entropy_output(model: nn.Module) -> nn.Module:
    """``model`` with its output layer made a :class:`CrossEntropyOutput` (its weights kept, the second
    output new). Only networks whose output layer's logits are their per-frame outputs qualify: one head."""
    output = getattr(model, "output", None)
    if type(output) is not nn.Linear or getattr(model, "heads", 1) != 1:
        raise ValueError(f"a separate cross-entropy output needs a network with one linear output layer "
                         f"(dnn, lstm, cnn without multi_frame), not a {type(model).__name__} with "
                         f"{type(output).__name__} outputs")
    head = CrossEntropyOutput(output.in_features, output.out_features).to(output.weight.device)
    with torch.no_grad():
        head.weight.copy_(output.weight)
        head.bias.copy_(output.bias)
    model.output = head
    return model


class DNN(nn.Module):
    """MLP over spliced frames (the classic hybrid DNN); with ``multi_frame`` k, evaluated every k-th frame with k
    output heads (:mod:`asrflow.nnet.frames`)."""

    BLOCK = 4  # modules of one hidden layer in ``body``: Linear, ReLU, LayerNorm, Dropout

    def __init__(self, input_dim: int, output_dim: int, *, hidden: int, layers: int, context: int,
                 multi_frame: int, dropout: float) -> None:
        super().__init__()
        self.context = context
        self.every = self.heads = multi_frame
        blocks: list[nn.Module] = []
        size = input_dim * (2 * context + 1)
        for _ in range(layers):
            blocks += [nn.Linear(size, hidden), nn.ReLU(), nn.LayerNorm(hidden), nn.Dropout(dropout)]
            size = hidden
        self.body = nn.Sequential(*blocks)
        self.output = nn.Linear(size, output_dim * multi_frame)

    def layer_units(self) -> list[Unit]:
        """The layers in order, sharing this network's modules (at the full frame rate, one head): the
        splicing, each hidden layer and the output layer; run in turn they give :meth:`forward`'s logits."""
        blocks = list(self.body)
        hidden = [Unit("layer", nn.Sequential(*blocks[i:i + self.BLOCK])) for i in range(0, len(blocks), self.BLOCK)]
        return [Unit("splice", context=self.context), *hidden, Unit("layer", self.output)]

    def skip_frames(self, every: int) -> None:
        """Evaluate every ``every``-th frame and copy its scores to the frames it skips (a one-head network)."""
        self.every = every

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spliced, start = at_anchors(splice(x, self.context, lengths), self.every,
                                    training_phase(self.every, self.training), dim=1)
        return full_rate(self.output(self.body(spliced)), self.every, self.heads, start, x.shape[1]), lengths


class LSTM(nn.Module):
    """Uni- or bidirectional LSTM, optionally with a projection (LSTMP)."""

    def __init__(self, input_dim: int, output_dim: int, *, hidden: int, layers: int, bidirectional: bool,
                 projection: int, dropout: float) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_dim, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional,
                           proj_size=projection, dropout=dropout if layers > 1 else 0.0)
        out = (projection or hidden) * (2 if bidirectional else 1)
        self.output = nn.Linear(out, output_dim)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        y, _ = self.rnn(packed)
        y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])
        return self.output(y), lengths


def hold_last(y: torch.Tensor, lengths: torch.Tensor, dim: int) -> torch.Tensor:
    """Overwrite the padding after each sequence's length (along ``dim``) with its last valid frame."""
    steps = y.shape[dim]
    t = torch.arange(steps, device=y.device)
    index = torch.minimum(t.unsqueeze(0), (lengths.to(y.device) - 1).clamp(min=0).unsqueeze(1))  # (B, T)
    shape = [y.shape[0]] + [1] * (y.dim() - 1)
    shape[dim] = steps
    return torch.gather(y, dim, index.reshape(shape).expand_as(y))


class CNN(nn.Module):
    """2-D convolutional front end over (time, frequency), then TDNN (dilated 1-D convolution) layers;
    with no ``channels``, a plain TDNN on the features. With ``multi_frame`` k the top TDNN layers (those
    whose dilations are multiples of k) and the k-head output layer run every k-th frame
    (:mod:`asrflow.nnet.frames`).

    Convolutions pad by repeating edge frames, like the DNN's splicing: zero padding would
    look like an average (speech-like) frame after CMVN and invite word insertions at the
    utterance edges. After every layer the padding of a batch is refilled with each
    utterance's last frame, so an utterance gives the same output alone or in a batch.
    """

    def __init__(self, input_dim: int, output_dim: int, *, channels: tuple[int, ...], tdnn_dim: int,
                 tdnn_dilations: tuple[int, ...], subsampling: int, norm: str, multi_frame: int,
                 dropout: float) -> None:
        super().__init__()
        if not channels and subsampling != 1 and multi_frame != 1:
            raise ValueError("a plain TDNN that subsamples outputs one frame per anchor: multi_frame must be 1")
        self.strides = (subsampling,) + (1,) * (len(channels) - 1) if channels else ()
        self.decimated = bool(not channels and subsampling != 1)  # outputs at its anchors only
        self.dilations = tdnn_dilations
        self.conv, size = conv_front_end(input_dim, channels, self.strides, norm)
        self.tdnn = nn.ModuleList()
        for d in tdnn_dilations:
            self.tdnn.append(nn.Sequential(
                nn.Conv1d(size, tdnn_dim, kernel_size=3, dilation=d, padding=d, padding_mode="replicate"),
                nn.ReLU(), normalisation(norm, tdnn_dim), nn.Dropout(dropout)))
            size = tdnn_dim
        self.output = nn.Linear(size, output_dim * multi_frame)
        self.heads = multi_frame
        self.skip_frames(subsampling if self.decimated else multi_frame)

    def skip_frames(self, every: int) -> None:
        """Run the layers from :func:`~asrflow.nnet.frames.decimation_layer` up every ``every``-th frame (their
        dilations divided by it); a one-head network's scores are copied to the frames it skips."""
        self.every, self.split = every, decimation_layer(self.dilations, every)
        for index, (d, block) in enumerate(zip(self.dilations, self.tdnn)):
            conv = block[0].first if isinstance(block[0], LowRank) else block[0]
            redilate(conv, d // every if index >= self.split else d)

    def layer_units(self) -> list[Unit]:
        """The layers in order, sharing this network's modules (without subsampling, at the full frame rate):
        the convolutional front end, each TDNN layer and the output layer; run in turn they give
        :meth:`forward`'s logits."""
        front = [Unit("front", self.conv, strides=self.strides)] if len(self.conv) else []
        return [*front, *(Unit("tdnn", block) for block in self.tdnn), Unit("layer", self.output)]

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, out_lengths = run_front_end(self.conv, self.strides, x, lengths)
        y, frames = y.transpose(1, 2), y.shape[1]  # (B, C·F, T')
        for block in self.tdnn[: self.split]:
            y = hold_last(block(y), out_lengths, dim=2)
        phase = 0 if self.decimated else training_phase(self.every, self.training)  # targets sit at frames 0, k, …
        y, start = at_anchors(y, self.every, phase, dim=2)
        valid = out_lengths
        if self.every > 1:  # the padding anchors repeat the last valid one, as the utterance alone would
            valid = anchor_lengths(out_lengths, self.every, start)
            y = hold_last(y, valid, dim=2)
        for block in self.tdnn[self.split:]:
            y = hold_last(block(y), valid, dim=2)
        logits = self.output(y.transpose(1, 2))
        if self.decimated:
            return logits, valid
        return full_rate(logits, self.every, self.heads, start, frames), out_lengths


NORMS = ("batch", "layer")


class FrameNorm(nn.Module):
    """Layer normalisation of each frame on its own, over all its features: the channels of a
    (B, C, T) tensor, or the channels × bins of a (B, C, T, F) one. Unlike batch normalisation it
    keeps no statistics across utterances, so training and inference compute the same thing."""

    def __init__(self, channels: int, bins: int | None = None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm((channels,) if bins is None else (channels, bins))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        if y.dim() == 3:
            return self.norm(y.transpose(1, 2)).transpose(1, 2)
        return self.norm(y.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)


def normalisation(norm: str, channels: int, bins: int | None = None) -> nn.Module:
    """The normaliser after a convolution: ``batch`` (BatchNorm over the batch's frames, running
    statistics at inference) or ``layer`` (:class:`FrameNorm`, each frame on its own); ``bins``
    for a 2-D convolution's frequency axis."""
    if norm == "batch":
        return nn.BatchNorm1d(channels) if bins is None else nn.BatchNorm2d(channels)
    if norm == "layer":
        return FrameNorm(channels, bins)
    raise ValueError(f"unknown norm {norm!r}; known: {', '.join(NORMS)}")


def conv_front_end(input_dim: int, channels: tuple[int, ...], strides: tuple[int, ...],
                   norm: str) -> tuple[nn.ModuleList, int]:
    """3 × 3 convolutions over (time, frequency), each with its time stride, halving the frequency
    axis while it has 8 bins or more, each followed by ReLU and the ``norm`` normaliser; the blocks
    and the features per output frame (channels × bins)."""
    blocks = nn.ModuleList()
    in_ch, freq = 1, input_dim
    for ch, stride_t in zip(channels, strides):
        out_freq = (freq + 1) // 2 if freq >= 8 else freq
        blocks.append(nn.Sequential(
            nn.Conv2d(in_ch, ch, kernel_size=3, stride=(stride_t, 2 if freq >= 8 else 1), padding=1,
                      padding_mode="replicate"),
            nn.ReLU(), normalisation(norm, ch, out_freq)))
        freq = out_freq
        in_ch = ch
    return blocks, in_ch * freq


def run_front_end(blocks: nn.ModuleList, strides: tuple[int, ...], x: torch.Tensor,
                  lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (B, T, D) through :func:`conv_front_end`'s blocks: (B, T', C·F) and the output lengths.

    Convolutions pad by repeating edge frames and every block's padding is refilled with each
    utterance's last frame, so an utterance gives the same output alone or in a batch.
    """
    y = x.unsqueeze(1)  # (B, 1, T, F)
    for block, stride in zip(blocks, strides):
        lengths = (lengths + stride - 1) // stride
        y = hold_last(block(y), lengths, dim=2)
    b, c, t, f = y.shape
    return y.permute(0, 2, 1, 3).reshape(b, t, c * f), lengths


class Conformer(nn.Module):
    """Conformer encoder (Gulati et al. 2020): a convolutional front end (``subsampling`` 1, 2 or 4 by
    stride-2 convolutions), sinusoidal positions, then blocks of half feed-forward, self-attention,
    convolution module and half feed-forward, each residual, with a final LayerNorm.

    Attention ignores padding frames (a key mask) and the convolution module zeroes them before
    its depthwise convolution, as an utterance alone sees zeros past its edges, so an utterance
    gives the same output alone or in a batch. The convolution module normalises with LayerNorm
    rather than BatchNorm, so padding never enters its statistics.
    """

    def __init__(self, input_dim: int, output_dim: int, *, dim: int, layers: int, heads: int, ffn_dim: int,
                 kernel: int, channels: tuple[int, ...], subsampling: int, norm: str, dropout: float) -> None:
        super().__init__()
        if subsampling not in (1, 2, 4):
            raise ValueError(f"a conformer's subsampling must be 1, 2 or 4, not {subsampling}")
        halvings = subsampling.bit_length() - 1
        if len(channels) < halvings:
            raise ValueError(f"subsampling {subsampling} needs {halvings} convolutions, channels has {len(channels)}")
        if dim % heads or kernel % 2 == 0:
            raise ValueError(f"a conformer needs dim a multiple of heads and an odd kernel (dim {dim}, heads {heads}, "
                             f"kernel {kernel})")
        self.strides = (2,) * halvings + (1,) * (len(channels) - halvings)
        self.front, size = conv_front_end(input_dim, channels, self.strides, norm)
        self.input = nn.Linear(size, dim)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(ConformerBlock(dim, heads, ffn_dim, kernel, dropout) for _ in range(layers))
        self.output = nn.Linear(dim, output_dim)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, out_lengths = run_front_end(self.front, self.strides, x, lengths)
        y = self.input(y)
        y = self.dropout(y + sinusoids(y.shape[1], y.shape[2], y.device).to(y.dtype))
        valid = torch.arange(y.shape[1], device=y.device).unsqueeze(0) < out_lengths.to(y.device).unsqueeze(1)
        for block in self.blocks:
            y = block(y, valid)
        return self.output(y), out_lengths


def sinusoids(frames: int, dim: int, device: torch.device) -> torch.Tensor:
    """The Transformer's sinusoidal position encodings (frames, dim)."""
    position = torch.arange(frames, device=device, dtype=torch.float32).unsqueeze(1)
    rate = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    out = torch.zeros(frames, dim, device=device)
    out[:, 0::2] = torch.sin(position * rate)
    out[:, 1::2] = torch.cos(position * rate[: dim // 2])
    return out


class ConformerBlock(nn.Module):
    """½ FFN → multi-head self-attention → convolution module → ½ FFN → LayerNorm, each residual."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, kernel: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ffn1, self.ffn2 = (nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, ffn_dim), nn.SiLU(),
                                              nn.Dropout(dropout), nn.Linear(ffn_dim, dim), nn.Dropout(dropout))
                                for _ in range(2))
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_out = nn.Linear(dim, dim)
        self.conv_norm = nn.LayerNorm(dim)
        self.pointwise_in = nn.Linear(dim, 2 * dim)
        self.depthwise = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.depthwise_norm = nn.LayerNorm(dim)
        self.pointwise_out = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.final_norm = nn.LayerNorm(dim)
        self.attention_dropout = dropout

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``x`` (B, T, dim); ``valid`` (B, T) marks the frames that are not padding."""
        x = x + 0.5 * self.ffn1(x)
        x = x + self.drop(self.attention(self.attn_norm(x), valid))
        x = x + self.drop(self.convolution(self.conv_norm(x), valid))
        x = x + 0.5 * self.ffn2(x)
        return self.final_norm(x)

    def attention(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :],
                                                       dropout_p=self.attention_dropout if self.training else 0.0)
        return self.attn_out(y.transpose(1, 2).reshape(b, t, d))

    def convolution(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        y = nn.functional.glu(self.pointwise_in(x), dim=-1)
        y = y.masked_fill(~valid.unsqueeze(2), 0.0)
        y = self.depthwise(y.transpose(1, 2)).transpose(1, 2)
        return self.pointwise_out(nn.functional.silu(self.depthwise_norm(y)))


class Ensemble(nn.Module):
    """Trained networks over one output inventory, combined frame by frame (system combination).

    ``members`` are the members' network configs as stored in their ``final.pt``. ``combine``:
    ``log_linear`` averages the members' log posteriors (a geometric mean, renormalised by the
    ``log_softmax`` every consumer applies), ``linear`` averages their posteriors. The output
    is a log posterior per frame, so decoders take it as any network's logits.
    """

    COMBINE = ("log_linear", "linear")

    def __init__(self, input_dim: int, output_dim: int, *, members: tuple[dict[str, Any], ...],
                 combine: str) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two member networks")
        if combine not in self.COMBINE:
            raise ValueError(f"unknown combine {combine!r}; known: {', '.join(self.COMBINE)}")
        self.combine = combine
        self.members = nn.ModuleList(build_model(m, input_dim, output_dim) for m in members)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = [member(x, lengths) for member in self.members]
        out_lengths = outputs[0][1]
        if any(not torch.equal(o[1], out_lengths) for o in outputs[1:]):
            raise ValueError("ensemble members give different numbers of output frames (subsampling must agree)")
        log_post = torch.stack([torch.log_softmax(o[0].float(), dim=-1) for o in outputs])
        if self.combine == "linear":
            return torch.logsumexp(log_post, dim=0) - math.log(len(outputs)), out_lengths
        return log_post.mean(dim=0), out_lengths


MODELS = {"dnn": DNN, "lstm": LSTM, "cnn": CNN, "conformer": Conformer, "ensemble": Ensemble}


def build_model(config: dict[str, Any], input_dim: int, output_dim: int) -> nn.Module:
    """Build the model named by ``config["type"]`` with the rest of ``config`` as its sizes
    (the type's defaults, :data:`asrflow.config.sizes.SIZES`, for those it leaves out). What a compressed
    network's ``final.pt`` stores in its config rebuilds its shape: ``ranks`` (layer name → rank)
    factorises those layers, ``pruned`` (layer names) masks their weights; ``xent_output`` (true) gives it
    a second, cross-entropy output (:class:`CrossEntropyOutput`; chain training's)."""
    options = network_config(config)
    kind = options.pop("type", None)
    ranks, pruned = options.pop("ranks", None), options.pop("pruned", None)
    xent_output = options.pop("xent_output", False)
    if kind not in MODELS:
        raise ValueError(f"unknown model type {kind!r}; known: {', '.join(MODELS)}")
    for key in ("channels", "tdnn_dilations"):
        if key in options:
            options[key] = tuple(options[key])
    model = MODELS[kind](input_dim, output_dim, **options)
    if ranks:
        factorise(model, ranks)
    if xent_output:
        with_cross_entropy_output(model)
    return masked(model, pruned) if pruned else model


def frame_context(model: nn.Module) -> int | None:
    """Frames either side of an output frame that it depends on: a DNN's splicing, a CNN-TDNN's receptive field
    (one frame per time convolution of the front end, the dilation of every TDNN layer). None for a network
    whose outputs depend on the whole utterance (recurrent, attention, an ensemble), that subsamples or that
    runs every k-th frame."""
    if getattr(model, "every", 1) != 1:
        return None
    if isinstance(model, DNN):
        return model.context
    if isinstance(model, CNN) and all(stride == 1 for stride in model.strides):
        return len(model.conv) + sum(model.dilations)
    return None


def parameter_count(model: nn.Module) -> int:
    """Trainable parameters; a pruned weight (``weight_orig`` with a ``weight_mask``) counts its kept entries."""
    total = 0
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad:
                mask = getattr(module, name.removesuffix("_orig") + "_mask", None) if name.endswith("_orig") else None
                total += int(mask.sum()) if mask is not None else param.numel()
    return total
