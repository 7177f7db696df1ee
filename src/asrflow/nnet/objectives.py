"""Training objectives: frame cross-entropy on tied states (hybrid) and CTC over units.

Both take the model's logits ``(B, T', C)``, its output lengths and the padded batch, and
return the mean loss with counts for logging. The trainer does not know which it runs.

Nothing here waits for a GPU: sums stay tensors on the model's device (the trainer reads them
every ``log_every`` steps), and counts come from the batch's lengths, which stay on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

BLANK = 0  # CTC blank index; units are numbered from 1


@dataclass
class LossStats:
    """Loss summed over the batch, with what it was summed over (sums as detached tensors on the model's device)."""

    loss_sum: torch.Tensor
    count: int  # frames (hybrid) or utterances (CTC)
    correct: torch.Tensor | None = None  # correctly classified frames (hybrid only)
    frames: int = 0  # input frames in the batch (for throughput)
    parts: dict[str, torch.Tensor] = field(default_factory=dict)  # terms of a combined loss, summed like loss_sum


def frame_cross_entropy(logits: torch.Tensor, out_lengths: torch.Tensor, batch: dict,
                        posteriors: torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """Mean cross-entropy over the non-padding frames (targets padded with -100; their number is the
    sum of ``target_lengths``), against the targets or, given ``posteriors`` ``(B, T', C)`` (0 on padding),
    against those soft targets; the frame accuracy is always the targets'."""
    targets = batch["targets"].to(logits.device)
    frames = int(batch["target_lengths"].sum())
    if posteriors is None:
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum")
    else:
        loss = -(posteriors.to(logits.device).float() * F.log_softmax(logits.float(), dim=-1)).sum()
    correct = ((logits.detach().argmax(-1) == targets) & (targets != -100)).sum()
    return loss / max(frames, 1), LossStats(loss.detach(), frames, correct, frames)


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
    return loss_sum / n, LossStats(loss_sum.detach(), n, None, int(batch["lengths"].sum()))


OBJECTIVES = {"hybrid": frame_cross_entropy, "ctc": ctc}
