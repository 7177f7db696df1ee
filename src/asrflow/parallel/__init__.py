"""Parallel training strategies on ``torch.distributed`` (gloo on CPU, NCCL on GPU).

``nnet.parallel.strategy`` picks one: ``allreduce`` (synchronous data parallelism),
``ring`` (the ring structure parallel strategy, RSPS), ``kavg`` (K-step model averaging),
``adpsgd`` (asynchronous decentralised parallel SGD), ``hierarchical`` (all-reduce groups
exchanging ADPSGD-style), ``asgd`` (parameter-server asynchronous SGD) and ``pipeline``
(pipelined back-propagation). Each records per
step the times of the timing model in :mod:`asrflow.parallel.timing`.
"""


class ParallelError(RuntimeError):
    """A learner is stuck or died, or the parallel settings cannot work; the message names the rank."""


def overlap_conflict(strategy: str, compression: str) -> str:
    """Why ``overlap`` (kavg's averages taken in one step late) cannot go with these settings; "" if it can.

    Torch-free, so config validation, the trainer and the emulation share one rule.
    """
    if strategy != "kavg" or compression != "none":
        return f"overlap applies to kavg without compression, not to {strategy}" + (
            f" with {compression}" if compression != "none" else "")
    return ""


def staleness(stages: int, stage: int) -> int:
    """Updates between a batch's forward pass in pipeline stage ``stage`` (of ``stages``) and the update its
    gradient makes there. Torch-free, so the learning-rate rule, the strategy and the emulation share it."""
    return 2 * (stages - 1 - stage)
