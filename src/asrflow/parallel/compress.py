"""Compression of what parallel learners put on the wire (gradients, model deltas, a ring's token).

Every compressor maps a flat 1-D float32 tensor to ONE 1-D ``torch.uint8`` payload whose size
depends only on the element count, so it goes through ``torch.distributed`` send/recv and
all_gather as it is; per-chunk float32 scales travel inside the payload, first::

    none   float32 bytes                                  4·n bytes, exact
    8bit   scale = max|x|/127 per chunk, int8 round(x/s)   n + 4·ceil(n/chunk) bytes (≈ 3.98× smaller)
    1bit   scale = mean|x| per chunk, signs 8 per byte      ceil(n/8) + 4·ceil(n/chunk) bytes (≈ 30× smaller)

Only vectorised torch operations, so the same code runs on a GPU. Lossy compression is meant
to be used through :class:`ErrorFeedback`, which carries what a payload missed into the next one.
"""

from __future__ import annotations

from typing import Any

import torch

COMPRESSIONS = ("none", "1bit", "8bit")

_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)  # bit weights of one packed byte


def _as_float32(data: torch.Tensor) -> torch.Tensor:
    """Reinterpret uint8 bytes as float32 (copying when they are not 4-byte aligned)."""
    data = data.contiguous()
    if data.storage_offset() % 4:
        data = data.clone()
    return data.view(torch.float32)


def _chunks(numel: int, chunk: int) -> int:
    return -(-numel // chunk)


def _padded(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` with zeros appended up to ``size`` elements."""
    return torch.nn.functional.pad(x, (0, size - x.numel())) if size > x.numel() else x


def _flat32(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(-1).to(torch.float32)


class Compressor:
    """Flat float32 tensor ↔ uint8 payload of :meth:`payload_size` bytes (no state, no error feedback)."""

    name = "base"

    def __init__(self, chunk: int = 1024) -> None:
        if chunk < 1:
            raise ValueError(f"compression chunk must be at least 1, not {chunk}")
        self.chunk = chunk

    def payload_size(self, numel: int) -> int:
        """Bytes of the payload for ``numel`` elements."""
        raise NotImplementedError

    def compress(self, x: torch.Tensor) -> torch.Tensor:
        """Flat float32 tensor → uint8 payload on the same device."""
        raise NotImplementedError

    def decompress(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        """uint8 payload → flat float32 tensor of ``numel`` elements on the payload's device."""
        raise NotImplementedError

    def _check(self, payload: torch.Tensor, numel: int) -> None:
        if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.numel() != self.payload_size(numel):
            raise ValueError(f"{self.name}: a payload for {numel} elements is {self.payload_size(numel)} uint8 bytes, "
                             f"got {payload.numel()} of {payload.dtype}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(chunk={self.chunk})"


class NoCompression(Compressor):
    """The float32 bytes themselves."""

    name = "none"

    def payload_size(self, numel: int) -> int:
        return 4 * numel

    def compress(self, x: torch.Tensor) -> torch.Tensor:
        return _flat32(x).clone().view(torch.uint8)

    def decompress(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        self._check(payload, numel)
        return _as_float32(payload).clone()


class OneBit(Compressor):
    """Signs packed 8 per byte; one scale per chunk (the chunk's mean absolute value).

    Zero counts as positive; decompression gives ``± scale``.
    """

    name = "1bit"

    def payload_size(self, numel: int) -> int:
        return 4 * _chunks(numel, self.chunk) + _chunks(numel, 8)

    def compress(self, x: torch.Tensor) -> torch.Tensor:
        x = _flat32(x)
        n, chunks = x.numel(), _chunks(x.numel(), self.chunk)
        sums = _padded(x.abs(), chunks * self.chunk).view(chunks, self.chunk).sum(1)
        counts = torch.full((chunks,), float(self.chunk), device=x.device)
        if chunks:
            counts[-1] = n - self.chunk * (chunks - 1)
        scales = sums / counts
        bits = _padded((x >= 0).to(torch.uint8), 8 * _chunks(n, 8)).view(-1, 8)
        packed = (bits * _BITS.to(x.device)).sum(1, dtype=torch.uint8)  # distinct bits: the sum never carries
        return torch.cat([scales.view(torch.uint8), packed])

    def decompress(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        self._check(payload, numel)
        chunks = _chunks(numel, self.chunk)
        scales = _as_float32(payload[:4 * chunks])
        bits = (payload[4 * chunks:].unsqueeze(1) & _BITS.to(payload.device)) != 0
        signs = bits.reshape(-1)[:numel].to(torch.float32) * 2 - 1
        out = _padded(signs, chunks * self.chunk).view(chunks, self.chunk) * scales.unsqueeze(1)
        return out.reshape(-1)[:numel].contiguous()


class EightBit(Compressor):
    """int8 values ``round(x / scale)`` with one scale per chunk (max |x| / 127; 0 for an all-zero chunk)."""

    name = "8bit"

    def payload_size(self, numel: int) -> int:
        return 4 * _chunks(numel, self.chunk) + numel

    def compress(self, x: torch.Tensor) -> torch.Tensor:
        x = _flat32(x)
        n, chunks = x.numel(), _chunks(x.numel(), self.chunk)
        blocks = _padded(x, chunks * self.chunk).view(chunks, self.chunk)
        scales = blocks.abs().amax(1) / 127 if chunks else x.new_zeros(0)
        safe = torch.where(scales > 0, scales, torch.ones_like(scales)).unsqueeze(1)
        values = torch.round(blocks / safe).clamp(-127, 127).to(torch.int8).reshape(-1)[:n]
        return torch.cat([scales.view(torch.uint8), values.view(torch.uint8)])

    def decompress(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        self._check(payload, numel)
        chunks = _chunks(numel, self.chunk)
        scales = _as_float32(payload[:4 * chunks])
        values = payload[4 * chunks:].view(torch.int8).to(torch.float32)
        out = _padded(values, chunks * self.chunk).view(chunks, self.chunk) * scales.unsqueeze(1)
        return out.reshape(-1)[:numel].contiguous()


_COMPRESSORS: dict[str, type[Compressor]] = {"none": NoCompression, "1bit": OneBit, "8bit": EightBit}


def make_compressor(name: str, chunk: int = 1024) -> Compressor:
    """The compressor called ``name`` (one of :data:`COMPRESSIONS`), with ``chunk`` elements per scale."""
    if name not in _COMPRESSORS:
        raise ValueError(f"unknown compression {name!r}; known: {', '.join(COMPRESSIONS)}")
    return _COMPRESSORS[name](chunk)


class ErrorFeedback:
    """Wraps a compressor with a residual (error feedback): compress(x) compresses x + residual and keeps
    residual = (x + residual) - decompress(payload).

    So nothing is lost, only delayed: the sum of everything decompressed so far differs from the
    sum of everything given to :meth:`compress` by the current residual alone.
    """

    def __init__(self, compressor: Compressor, numel: int, device: torch.device | str = "cpu") -> None:
        self.compressor, self.numel = compressor, numel
        self.residual = torch.zeros(numel, dtype=torch.float32, device=device)

    def compress(self, x: torch.Tensor) -> torch.Tensor:
        """Payload of ``x`` plus the carried residual; the residual becomes what this payload misses."""
        corrected = _flat32(x) + self.residual
        payload = self.compressor.compress(corrected)
        self.residual = corrected - self.compressor.decompress(payload, self.numel)
        return payload

    def decompress(self, payload: torch.Tensor) -> torch.Tensor:
        """The receiving side: the wrapped compressor's decompression for :attr:`numel` elements."""
        return self.compressor.decompress(payload, self.numel)

    def payload_size(self) -> int:
        """Bytes of every payload this sender produces."""
        return self.compressor.payload_size(self.numel)

    def state_dict(self) -> dict[str, Any]:
        """The residual (a checkpoint needs it: dropping it loses what earlier payloads missed)."""
        return {"residual": self.residual.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (onto this object's device)."""
        residual = state["residual"]
        if residual.shape != self.residual.shape:
            raise ValueError(f"error-feedback residual has {residual.numel()} elements, expected {self.numel}")
        self.residual = residual.to(device=self.residual.device, dtype=torch.float32).clone()
