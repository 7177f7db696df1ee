"""The arithmetic a trained network is scored in at decoding (``nnet.decode.precision``).

* ``float32``: as trained.
* ``bfloat16``: the forward pass under :func:`torch.autocast` (matrix products in bfloat16); fast on GPUs and on
  CPUs with bfloat16 matrix units (AMX, AVX-512 BF16), slow on others.
* ``int8``: dynamic int8 quantisation on the CPU (:func:`int8_network`): the weights of every linear and LSTM layer
  stored as int8 with a scale per tensor, each batch's activations quantised on the fly, products accumulated in
  int32 (PyTorch's fbgemm / qnnpack kernels), the way CPU speech recognisers are usually deployed. A TDNN's dilated
  1-D convolutions become the linear layers they are over spliced frames (:class:`SplicedLinear`) so that they are
  quantised too; 2-D convolutions, normalisations and the softmax stay in float32.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

PRECISIONS = ("float32", "bfloat16", "int8")


class SplicedLinear(nn.Module):
    """A 1-D convolution (odd kernel k, dilation d, stride 1, padding ``d·(k−1)/2`` by repeating the edge frames) as
    one linear layer over each frame's k spliced input frames: ``(B, C, T)`` in, ``(B, C', T)`` out, as the
    convolution gives them."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        if not convertible(conv):
            raise ValueError(f"not a frame-spliced convolution: {conv}")
        (self.kernel,), (self.dilation,) = conv.kernel_size, conv.dilation
        self.linear = nn.Linear(conv.in_channels * self.kernel, conv.out_channels, bias=conv.bias is not None)
        with torch.no_grad():  # (C', C, k) -> (C', k·C): input frame j's channels at columns j·C … (j+1)·C − 1
            self.linear.weight.copy_(conv.weight.permute(0, 2, 1).reshape(conv.out_channels, -1))
            if conv.bias is not None:
                self.linear.bias.copy_(conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        reach, frames = self.dilation * (self.kernel // 2), x.shape[2]
        padded = nn.functional.pad(x, (reach, reach), mode="replicate").transpose(1, 2)  # (B, T + 2·reach, C)
        spliced = torch.cat([padded[:, j * self.dilation: j * self.dilation + frames] for j in range(self.kernel)],
                            dim=2)
        return self.linear(spliced).transpose(1, 2)


def convertible(conv: nn.Module) -> bool:
    """Whether ``conv`` is a TDNN layer's convolution (or a 1 × 1 one) that :class:`SplicedLinear` reproduces."""
    if type(conv) is not nn.Conv1d or conv.stride != (1,) or conv.groups != 1 or conv.kernel_size[0] % 2 != 1:
        return False
    reach = conv.dilation[0] * (conv.kernel_size[0] // 2)
    return conv.padding == (reach,) and (reach == 0 or conv.padding_mode == "replicate")


def spliced(model: nn.Module) -> nn.Module:
    """``model`` with every convertible 1-D convolution replaced by its :class:`SplicedLinear` (in place; the
    dilations as they are now, so frame skipping is set first)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if convertible(child):
                setattr(module, name, SplicedLinear(child))
    return model


def int8_network(model: nn.Module) -> nn.Module:
    """``model`` (on the CPU, in eval mode) with its linear and LSTM layers dynamically quantised to int8, a TDNN's
    convolutions first made linear (:func:`spliced`)."""
    with warnings.catch_warnings():  # torch.ao.quantization's notice that it moves to torchao one day
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(spliced(model), {nn.Linear, nn.LSTM}, dtype=torch.qint8)


def with_precision(model: nn.Module, precision: str, device: torch.device) -> nn.Module:
    """``model`` made ready to score in ``precision`` on ``device`` (int8 converts it; the others leave it)."""
    if precision not in PRECISIONS:
        raise ValueError(f"nnet.decode.precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "int8":
        if device.type != "cpu":
            from asrflow.nnet import NnetError

            raise NnetError("nnet.decode.precision int8 runs on the CPU (dynamic quantisation); on a GPU use "
                            "bfloat16 or float32")
        return int8_network(model)
    return model


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context a forward pass runs in: bfloat16 autocast on ``device``, or nothing."""
    if precision == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
