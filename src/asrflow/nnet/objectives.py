"""Training objectives: frame cross-entropy on tied states (hybrid) and CTC over units.

Both take the model's logits ``(B, T', C)``, its output lengths and the padded batch, and
return the mean loss with counts for logging. The trainer does not know which it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

BLANK = 0  # CTC blank index; units are numbered from 1


@dataclass
class LossStats:
    """Loss summed over the batch, with what it was summed over."""

    loss_sum: float
    count: int  # frames (hybrid) or utterances (CTC)
    correct: int | None = None  # correctly classified frames (hybrid only)
    frames: int = 0  # input frames in the batch (for throughput)
    parts: dict[str, float] = field(default_factory=dict)  # terms of a combined loss, summed like loss_sum


def frame_cross_entropy(logits: torch.Tensor, out_lengths: torch.Tensor,
                        batch: dict) -> tuple[torch.Tensor, LossStats]:
    """Mean cross-entropy over the non-padding frames (targets padded with -100)."""
    targets = batch["targets"].to(logits.device)
    mask = targets != -100
    picked = logits[mask].float()
    loss = F.cross_entropy(picked, targets[mask])
    frames = int(mask.sum())
    correct = int((picked.argmax(-1) == targets[mask]).sum())
    return loss, LossStats(float(loss.detach()) * frames, frames, correct, frames)


def ctc(logits: torch.Tensor, out_lengths: torch.Tensor, batch: dict) -> tuple[torch.Tensor, LossStats]:
    """CTC loss per utterance (blank = 0), averaged over the batch.

    Computed in float32 (also under mixed precision); impossible alignments give zero loss
    instead of inf (``zero_infinity``), but the data pipeline already rejects them.
    """
    targets = batch["targets"].to(logits.device)
    target_lengths = batch["target_lengths"].to(logits.device)
    log_probs = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # (T', B, C)
    flat = targets[targets != -100]
    loss_sum = F.ctc_loss(log_probs, flat, out_lengths.to(logits.device), target_lengths, blank=BLANK,
                          reduction="sum", zero_infinity=True)
    n = targets.shape[0]
    return loss_sum / n, LossStats(float(loss_sum.detach()), n, None, int(batch["lengths"].sum()))


OBJECTIVES = {"hybrid": frame_cross_entropy, "ctc": ctc}
