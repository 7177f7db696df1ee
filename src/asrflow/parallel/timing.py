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
    def from_dict(cls, values: dict[str, float]) -> StepTimes:
        """Inverse of :meth:`as_dict` (missing keys are 0)."""
        names = {("bytes_per_step" if f.name == "bytes" else f"t_{f.name}"): f.name for f in fields(cls)}
        return cls(**{names[k]: float(v) for k, v in values.items() if k in names})


def n_max(times: StepTimes) -> float:
    """Learners beyond which RSPS stops scaling: (T_calc + T_merge) / (T_transmit + T_merge)."""
    denominator = times.transmit + times.merge
    return float("inf") if denominator <= 0 else (times.calc + times.merge) / denominator


def predict_speedup(strategy: str, learners: int, times: StepTimes) -> float:
    """Predicted speedup of ``learners`` over one learner processing the same data.

    ``times`` are a learner's mean per-step times measured with ``learners`` learners; ``calc``
    should include reading the batch (it is local work that parallelises). One learner's step
    takes ``C + M`` (compute, then apply the gradient); with ``n`` learners each does ``1/n``
    of the steps:

    - ``ring``: ``min(n, n_max)``, the RSPS model (transmission overlaps computation, the
      circulating model saturates the ring at ``n_max``);
    - ``adpsgd``: the pairwise exchange overlaps computation: ``n (C + M) / (max(C, T) + M)``;
    - ``allreduce``, ``kavg``, ``hierarchical``: the blocking part of the exchange (per-step
      mean, so kavg's ``1/k`` and hierarchical's in-group all-reduce are already in ``T``):
      ``n (C + M) / (C + T + M)``;
    - ``asgd``: as the blocking form, but the server takes one gradient and returns one model
      at a time, capping it at ``(C + M) / (2 T + M)``;
    - ``pipeline``: ``n`` balanced stages (:func:`pipeline_speedup`), ``T`` a tick's activations and
      gradients on the wire.

    kavg's ``k`` and hierarchical's ``group_size`` need no parameter: the measured times
    already reflect them.
    """
    n = learners
    if n <= 1:
        return 1.0
    step = times.calc + times.merge
    if strategy == "ring":
        return min(float(n), n_max(times))
    if strategy == "adpsgd":
        return n * step / (max(times.calc, times.transmit) + times.merge)
    blocking = n * step / (step + times.transmit)
    if strategy in ("allreduce", "kavg", "hierarchical"):
        return blocking
    if strategy == "asgd":
        server = 2 * times.transmit + times.merge
        return min(blocking, step / server if server > 0 else float(n))
    if strategy == "pipeline":  # ``times``: one learner's whole step; stages balanced (see pipeline_speedup)
        return pipeline_speedup([1.0 / n] * n, transmit=times.transmit / step if step > 0 else 0.0)
    raise ValueError(f"unknown strategy {strategy!r}")


def speedup_curve(strategy: str, times: StepTimes, learners: list[int]) -> list[tuple[int, float]]:
    """``(n, predicted speedup)`` for each learner count."""
    return [(n, predict_speedup(strategy, n, times)) for n in learners]


def pipeline_speedup(shares: list[float], batches: int | None = None, transmit: float = 0.0) -> float:
    """Predicted speedup of pipelined back-propagation over one learner running every layer.

    ``shares`` are the stages' parts of one learner's step (forward and backward of their layers;
    they sum to 1). One learner's step is their sum; the pipeline's tick is its slowest stage's part
    plus ``transmit`` (the wire time of a tick's activations and gradients, as a part of the step), so
    in steady state it runs ``1 / (max share + transmit)`` times as fast. Filling and draining the
    pipeline cost ``2 (S − 1)`` ticks per ``batches`` batches (None: never drained).
    """
    stages = len(shares)
    if stages <= 1:
        return 1.0
    fill = 1.0 + 2 * (stages - 1) / batches if batches else 1.0
    return sum(shares) / ((max(shares) + transmit) * fill)
