"""The timing model: per-step times of a learner and the speedup they predict.

A learner's step is split into ``calc`` (forward + backward), ``transmit`` (time on the wire
for what it sends, measured without overlap), ``merge`` (merging a received model or
averaging), ``wait`` (time blocked on communication after its own work is done) and
``data`` (reading the batch). For the ring structure parallel strategy (RSPS) transmission
overlaps computation, so n learners speed training up n-fold until the wire or the merge
becomes the bottleneck::

    n_max = (T_calc + T_merge) / (T_transmit + T_merge)
    speedup(n) = n if n <= n_max else n_max

The other strategies have their own closed forms (:func:`predict_speedup`); the
discrete-event simulator in :mod:`asrflow.parallel.simulate` checks them beyond one machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class StepTimes:
    """Mean seconds per step of one learner, and bytes it sends per step."""

    calc: float = 0.0
    transmit: float = 0.0
    merge: float = 0.0
    wait: float = 0.0
    data: float = 0.0
    bytes: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """Keys ``t_calc``, ``t_transmit``, ``t_merge``, ``t_wait``, ``t_data``, ``bytes_per_step``."""
        return {("bytes_per_step" if k == "bytes" else f"t_{k}"): v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, float]) -> "StepTimes":
        """Inverse of :meth:`as_dict` (missing keys are 0)."""
        names = {("bytes_per_step" if f.name == "bytes" else f"t_{f.name}"): f.name for f in fields(cls)}
        return cls(**{names[k]: float(v) for k, v in values.items() if k in names})


def n_max(times: StepTimes) -> float:
    """Learners beyond which RSPS stops scaling: (T_calc + T_merge) / (T_transmit + T_merge)."""
    denominator = times.transmit + times.merge
    return float("inf") if denominator <= 0 else (times.calc + times.merge) / denominator


def predict_speedup(strategy: str, learners: int, times: StepTimes, k: int = 1, group_size: int = 1) -> float:
    """Predicted speedup of ``learners`` over one learner processing the same data.

    ``times`` are one learner's per-step times measured with ``learners`` learners (calc
    and data from a single learner are assumed unchanged). Steps are per learner, each on
    its own batch, so one learner needs ``learners`` times as many steps.

    - ``ring`` and ``adpsgd`` overlap the exchange with computation: ``min(n, n_max)``.
    - ``allreduce`` blocks on the wire every step: ``n * (C) / (C + T_transmit + T_merge)``
      with ``C = T_calc + T_data``.
    - ``kavg`` pays the exchange once every ``k`` steps.
    - ``hierarchical``: all-reduce within groups of ``group_size``, overlapped exchange across.
    - ``asgd``: the server applies one gradient at a time, so it saturates at
      ``(C + T_transmit + T_merge) / (T_transmit + T_merge)`` learners.
    """
    n = learners
    if n <= 1:
        return 1.0
    local = times.calc + times.data
    if strategy in ("ring", "adpsgd"):
        return min(float(n), n_max(StepTimes(calc=local, transmit=times.transmit, merge=times.merge)))
    if strategy == "allreduce":
        return n * local / (local + times.transmit + times.merge)
    if strategy == "kavg":
        return n * local / (local + (times.transmit + times.merge) / max(k, 1))
    if strategy == "hierarchical":
        return n * local / (local + times.merge)  # times.merge holds the in-group all-reduce; the ring part overlaps
    if strategy == "asgd":
        server = times.transmit + times.merge
        return min(float(n), (local + server) / server if server > 0 else float(n))
    raise ValueError(f"unknown strategy {strategy!r}")


def speedup_curve(strategy: str, times: StepTimes, learners: list[int], k: int = 1,
                  group_size: int = 1) -> list[tuple[int, float]]:
    """``(n, predicted speedup)`` for each learner count."""
    return [(n, predict_speedup(strategy, n, times, k, group_size)) for n in learners]
