"""The strategy registry: ``nnet.parallel.strategy`` → the class driving a learner's steps."""

from __future__ import annotations

from typing import Any

import torch

from asrflow.config.settings import STRATEGY_NAMES, Parallel
from asrflow.parallel import ParallelError
from asrflow.parallel.base import Strategy
from asrflow.parallel.gossip import ADPSGD, Hierarchical
from asrflow.parallel.pipeline import Pipeline
from asrflow.parallel.ring import Ring
from asrflow.parallel.server import ASGD
from asrflow.parallel.sync import AllReduce, KAvg

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (AllReduce, Ring, KAvg, ADPSGD, Hierarchical, ASGD,
                                                                   Pipeline)}
assert tuple(STRATEGIES) == STRATEGY_NAMES


def make_strategy(opts: Parallel, model: torch.nn.Module, optimiser: torch.optim.Optimizer, scheduler: Any,
                  rank: int, world: int, device: torch.device, clip: float) -> Strategy:
    """The learner's strategy object (plain single-learner SGD when ``world`` is 1)."""
    cls = STRATEGIES[opts.strategy]
    if opts.compression != "none" and not cls.compressible:
        compressible = ", ".join(name for name, c in STRATEGIES.items() if c.compressible)
        raise ParallelError(f"nnet.parallel.compression {opts.compression!r} works with {compressible}, "
                            f"not {opts.strategy}")
    return strategy_class(opts, world)(model, optimiser, scheduler, opts, rank, world, device, clip)


def strategy_class(opts: Parallel, world: int) -> type[Strategy]:
    """The class :func:`make_strategy` builds: plain single-learner SGD when ``world`` is 1."""
    return Strategy if world == 1 else STRATEGIES[opts.strategy]
