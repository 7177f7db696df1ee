"""Teacher–student training (Li et al. 2014; Hinton et al. 2015): a hybrid network learns a trained
network's output distribution over the same tied states, frame by frame.

The loss per labelled frame is ``(1 − weight) · CE(alignment) + weight · T² · KL(p_teacher^T ‖ p_student^T)``,
where ``p^T`` is a softmax at temperature ``T`` (the T² keeps the gradient's scale as T grows).
The teacher (any trained hybrid network or ensemble over the same alignments and features) runs
in inference mode on the student's batch, so with SpecAugment it sees the same masked input.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from asrflow.nnet.objectives import LossStats, frame_cross_entropy


class DistillObjective:
    """Hybrid training objective: cross-entropy on the alignments mixed with the KL divergence from the
    teacher's posteriors. Called like the objectives of :mod:`asrflow.nnet.objectives`; its
    :class:`LossStats` carry the KL term in ``parts``."""

    def __init__(self, teacher: torch.nn.Module, weight: float, temperature: float) -> None:
        if not 0.0 <= weight <= 1.0 or temperature <= 0:
            raise ValueError(f"a teacher's weight must be in [0, 1] and its temperature positive "
                             f"(got {weight}, {temperature})")
        self.teacher = teacher.eval().requires_grad_(False)
        self.weight, self.temperature = weight, temperature

    def teacher_log_posteriors(self, batch: dict, device: torch.device) -> torch.Tensor:
        """The teacher's log posteriors at the temperature, (B, T, classes), on ``device``."""
        if next(self.teacher.parameters()).device != device:
            self.teacher.to(device)
        with torch.no_grad():
            logits, _ = self.teacher(batch["feats"].to(device), batch["lengths"])
            return F.log_softmax(logits.float() / self.temperature, dim=-1)

    def __call__(self, logits: torch.Tensor, out_lengths: torch.Tensor,
                 batch: dict) -> tuple[torch.Tensor, LossStats]:
        cross_entropy, stats = frame_cross_entropy(logits, out_lengths, batch)
        teacher = self.teacher_log_posteriors(batch, logits.device)
        if teacher.shape != logits.shape:
            raise ValueError(f"the teacher's outputs {tuple(teacher.shape)} do not match the student's "
                             f"{tuple(logits.shape)} (the same tied states and frames are needed)")
        student = F.log_softmax(logits.float() / self.temperature, dim=-1)
        labelled = (batch["targets"].to(logits.device) != -100).unsqueeze(-1)
        kl = ((teacher.exp() * (teacher - student)) * labelled).sum() / max(stats.count, 1)
        kl = kl * self.temperature ** 2
        loss = (1.0 - self.weight) * cross_entropy + self.weight * kl
        return loss, LossStats(loss.detach() * stats.count, stats.count, stats.correct, stats.frames,
                               {"distill": kl.detach() * stats.count})
