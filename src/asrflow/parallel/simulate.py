"""A discrete-event model of parallel training beyond this machine.

Driven by measured per-step times of one learner (``t_calc`` = forward + backward, ``t_merge``
= applying one gradient to a model or averaging two models) and a network description, it
projects the speedup of each parallel strategy of :mod:`asrflow.parallel` for any number of
learners, flat (every learner its own node) or hierarchical (nodes of ``group_size`` learners).

The model:

- An event queue (:mod:`heapq`) runs actions in time order.
- Each learner has an outgoing and an incoming link, each a serial resource (full duplex: a
  learner sends one message at a time and receives one at a time). A point-to-point message
  holds the sender's outgoing and the receiver's incoming link for ``latency + bytes /
  bandwidth`` seconds, starting when both are free; requests are served first come, first
  served. Between learners of one node (``r // group_size`` equal) the intra-node figures of
  :class:`Network` apply, otherwise the inter-node ones. Nodes' network interfaces are not
  modelled as shared: with learners placed on nodes in rank order, the strategies below send
  at most one message at a time out of a node anyway (except ``asgd``, whose server is the
  bottleneck).
- Collectives (ring all-reduce) take their closed-form time, ``2 (m-1)/m * bytes / bandwidth
  + 2 (m-1) * latency`` over ``m`` learners, rather than being played out message by message.
- Bytes on the wire are ``model_bytes / compression`` for every point-to-point message, and
  compressed averages are all-gathers of the payloads (as in :mod:`asrflow.parallel.sync`).
  The real ``adpsgd``, ``hierarchical`` and ``asgd`` do not compress: for them compression
  is a what-if (and the in-node all-reduce of ``hierarchical`` is never compressed).
- With ``jitter`` > 0, each step's ``t_calc`` is multiplied by a lognormal factor with
  ``sigma = jitter`` and mean 1 (``mu = -sigma**2 / 2``), drawn from a seeded
  :func:`numpy.random.default_rng`, so stragglers cost what waiting for them costs.

The baseline is one learner doing ``learners * steps`` steps in ``learners * steps * (t_calc +
t_merge)`` seconds; the speedup is that over the makespan of ``learners`` learners doing
``steps`` steps each.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np

from asrflow.parallel.timing import StepTimes, n_max
from asrflow.parallel.topology import partner

STRATEGIES = ("ring", "adpsgd", "allreduce", "kavg", "hierarchical", "asgd", "pipeline")


@dataclass(frozen=True)
class Network:
    """Link figures: bandwidth in bytes/s and latency in s, between nodes and inside one node."""

    bandwidth: float = 1.25e9
    latency: float = 5e-5
    intra_bandwidth: float = 2.5e10
    intra_latency: float = 5e-6

    def wire(self, nbytes: float, intra: bool = False) -> float:
        """Seconds one message of ``nbytes`` occupies a link (latency + bytes / bandwidth)."""
        if intra:
            return self.intra_latency + nbytes / self.intra_bandwidth
        return self.latency + nbytes / self.bandwidth


@dataclass
class SimConfig:
    """One simulated run: a strategy, ``learners`` learners doing ``steps`` steps each.

    ``group_size`` is the number of learners per node (1 = flat: every learner its own node);
    ``k`` the averaging period of ``kavg``, ``overlap`` its averages taken in one step late.
    """

    strategy: str
    learners: int
    t_calc: float
    t_merge: float
    model_bytes: float
    network: Network = field(default_factory=Network)
    k: int = 4
    group_size: int = 1
    compression: float = 1.0
    steps: int = 200
    jitter: float = 0.0
    seed: int = 0
    overlap: bool = False

    def validate(self) -> None:
        """Raise ``ValueError`` for settings the simulator cannot run."""
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        for name in ("learners", "steps", "k", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.t_calc < 0 or self.t_merge < 0 or self.t_calc + self.t_merge <= 0:
            raise ValueError("t_calc and t_merge must be >= 0 and not both 0")
        if self.compression <= 0 or self.model_bytes < 0 or self.jitter < 0:
            raise ValueError("compression must be > 0, model_bytes and jitter >= 0")

    @property
    def single_node(self) -> bool:
        """Whether all learners share one multi-learner node (then every link is an intra-node one)."""
        return self.group_size > 1 and self.learners <= self.group_size

    @property
    def wire_bytes(self) -> float:
        """Bytes of one message on the wire."""
        return self.model_bytes / self.compression


@dataclass
class SimResult:
    """What one simulated run gives: makespan, speedup over one learner, and the wire figures used.

    ``step_time`` is the makespan over ``steps`` (wall seconds per step of a learner);
    ``transmit`` one message's wire time (inter-node, or intra-node when all learners share one
    node); ``n_max`` the RSPS saturation ``(t_calc + t_merge) / (transmit + t_merge)``.
    """

    strategy: str
    learners: int
    group_size: int
    makespan: float
    speedup: float
    step_time: float
    transmit: float
    n_max: float

    def as_dict(self) -> dict:
        """The fields as a plain dict (for CSV/JSON rows)."""
        return asdict(self)


class _Engine:
    """A discrete-event loop: actions run in time order, ties in the order they were scheduled."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, time: float, action: Callable[[], None]) -> None:
        """Run ``action`` at ``time`` (never before now)."""
        heapq.heappush(self._queue, (max(time, self.now), next(self._order), action))

    def after(self, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` ``delay`` seconds from now."""
        self.at(self.now + delay, action)

    def run(self) -> None:
        """Run actions until none is left."""
        while self._queue:
            self.now, _, action = heapq.heappop(self._queue)
            action()


@dataclass
class _Resource:
    """A serial resource (one direction of a link, a server's update loop): one job at a time."""

    free_at: float = 0.0


def _occupy(engine: _Engine, resources: Iterable[_Resource], duration: float, then: Callable[[], None]) -> None:
    """Hold all ``resources`` for ``duration`` from when they are all free, then run ``then``.

    Reservations are made in event order, so each resource serves its requests first come,
    first served.
    """
    resources = tuple(resources)
    start = max(engine.now, *(r.free_at for r in resources))
    for resource in resources:
        resource.free_at = start + duration
    engine.at(start + duration, then)


def allreduce_time(members: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``members`` learners: 2(m-1)/m b/B + 2(m-1) L."""
    if members <= 1:
        return 0.0
    return 2 * (members - 1) / members * nbytes / bandwidth + 2 * (members - 1) * latency


class _Job:
    """Shared state of one run: the event loop, the learners' links, their compute times, finish times."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.n = cfg.learners
        self.engine = _Engine()
        self.outgoing = [_Resource() for _ in range(self.n)]
        self.incoming = [_Resource() for _ in range(self.n)]
        self.finish = [0.0] * self.n
        factors = np.ones((self.n, cfg.steps))
        if cfg.jitter > 0:
            rng = np.random.default_rng(cfg.seed)
            factors = rng.lognormal(mean=-cfg.jitter**2 / 2, sigma=cfg.jitter, size=(self.n, cfg.steps))
        self.calc: list[list[float]] = (cfg.t_calc * factors).tolist()

    def wire(self, src: int, dst: int) -> float:
        """Wire time of one message from learner ``src`` to ``dst`` (intra figures inside a node)."""
        g = self.cfg.group_size
        return self.cfg.network.wire(self.cfg.wire_bytes, intra=src // g == dst // g)

    def send(self, src: int, dst: int, then: Callable[[], None]) -> None:
        """Send one message from ``src`` to ``dst`` over their links; ``then`` runs on arrival."""
        _occupy(self.engine, (self.outgoing[src], self.incoming[dst]), self.wire(src, dst), then)

    def collective(self, members: int, intra: bool) -> float:
        """Closed-form time to average a model-sized vector over ``members`` learners.

        Uncompressed: a ring all-reduce of ``model_bytes``. Compressed: a ring all-gather of the
        ``members`` compressed payloads, ``(m-1) * (latency + bytes / compression / bandwidth)``,
        as :mod:`asrflow.parallel.sync` does (payloads cannot be summed on the way).
        """
        net = self.cfg.network
        bandwidth, latency = (net.intra_bandwidth, net.intra_latency) if intra else (net.bandwidth, net.latency)
        if self.cfg.compression == 1 or members <= 1:
            return allreduce_time(members, self.cfg.model_bytes, bandwidth, latency)
        return (members - 1) * (latency + self.cfg.wire_bytes / bandwidth)

    def done(self, rank: int) -> None:
        """Record that ``rank`` finished its last step now."""
        self.finish[rank] = self.engine.now


def _ring(job: _Job) -> None:
    """RSPS: one model token circulates 0→1→…→n-1→0; a learner merges its gradient when it holds it.

    Learner r computes a gradient on its local copy; once the gradient is ready and the token
    has arrived it merges (``t_merge``), passes the token to r+1 (over the links) and starts its
    next gradient at once, so computation overlaps the transmission. Learner 0 holds the token
    at t=0; every learner merges ``steps`` times. With one learner the token never leaves it.
    """
    n, steps, t_merge, engine = job.n, job.cfg.steps, job.cfg.t_merge, job.engine
    gradient = [False] * n
    token = [r == 0 for r in range(n)]
    merges = [0] * n

    def compute(r: int) -> None:
        engine.after(job.calc[r][merges[r]], partial(gradient_ready, r))

    def gradient_ready(r: int) -> None:
        gradient[r] = True
        try_merge(r)

    def token_arrived(r: int) -> None:
        token[r] = True
        try_merge(r)

    def try_merge(r: int) -> None:
        if gradient[r] and token[r]:
            gradient[r] = token[r] = False
            engine.after(t_merge, partial(merged, r))

    def merged(r: int) -> None:
        merges[r] += 1
        nxt = (r + 1) % n
        if merges[nxt] < steps:
            if nxt == r:
                token_arrived(r)
            else:
                job.send(r, nxt, partial(token_arrived, nxt))
        if merges[r] < steps:
            compute(r)
        else:
            job.done(r)

    for rank in range(n):
        compute(rank)


def _adpsgd(job: _Job) -> None:
    """ADPSGD: pairwise model averaging with alternating partners and no global barrier.

    At the start of step s a learner sends its current model to ``partner(r, n, s)`` (overlapped
    with its computation), computes, waits for the partner's step-s model and averages
    (``t_merge``, which also covers applying its gradient). Without a partner it only computes
    and applies.
    """
    n, steps, t_merge, engine = job.n, job.cfg.steps, job.cfg.t_merge, job.engine
    step = [0] * n
    computed = [False] * n
    mail: set[tuple[int, int]] = set()

    def start(r: int) -> None:
        s = step[r]
        if s == steps:
            job.done(r)
            return
        other = partner(r, n, s)
        if other is not None:
            job.send(r, other, partial(delivered, other, s))
        engine.after(job.calc[r][s], partial(calculated, r))

    def delivered(r: int, s: int) -> None:
        mail.add((r, s))
        if step[r] == s:
            try_average(r)

    def calculated(r: int) -> None:
        computed[r] = True
        try_average(r)

    def try_average(r: int) -> None:
        s = step[r]
        if computed[r] and (partner(r, n, s) is None or (r, s) in mail):
            computed[r] = False
            mail.discard((r, s))
            engine.after(t_merge, partial(finished, r))

    def finished(r: int) -> None:
        step[r] += 1
        start(r)

    for rank in range(n):
        start(rank)


def _allreduce(job: _Job) -> None:
    """Synchronous data parallelism: all compute, all-reduce the gradient (:meth:`_Job.collective`), apply.

    A step's all-reduce starts only when every learner has finished computing (a barrier, so
    stragglers hurt). It uses the intra-node figures when all learners share one node
    (``group_size >= learners``), the inter-node ones otherwise (the slowest hop sets the pace
    of a ring all-reduce).
    """
    n, steps, engine = job.n, job.cfg.steps, job.engine
    reduce_and_apply = job.collective(n, intra=job.cfg.single_node) + job.cfg.t_merge
    state = {"step": 0, "arrived": 0}

    def begin() -> None:
        for r in range(n):
            engine.after(job.calc[r][state["step"]], arrive)

    def arrive() -> None:
        state["arrived"] += 1
        if state["arrived"] == n:
            state["arrived"] = 0
            engine.after(reduce_and_apply, end)

    def end() -> None:
        state["step"] += 1
        if state["step"] < steps:
            begin()
        else:
            for r in range(n):
                job.done(r)

    begin()


def _kavg(job: _Job) -> None:
    """K-step model averaging: local steps (``t_calc + t_merge``), a synchronous average every k steps.

    After every ``k``-th step, and after the last, all learners meet at a barrier, all-reduce
    their parameters (figures as for ``allreduce``) and average them (``t_merge``). One learner
    never averages. With ``overlap`` (:class:`asrflow.parallel.sync.KAvg`) a learner does not
    stop at an average: the all-reduce ends ``collective`` after the last learner's snapshot,
    and each learner takes it in (``t_merge``) after its next step, waiting only if it is not
    there yet (after its last step it waits for it).
    """
    n, steps, k, engine = job.n, job.cfg.steps, job.cfg.k, job.engine
    t_merge = job.cfg.t_merge
    collective = job.collective(n, intra=job.cfg.single_node)
    average = collective + t_merge
    step = [0] * n
    waiting = [0]
    overlap = job.cfg.overlap and n > 1
    arrived: dict[int, int] = {}  # overlap: average number -> learners that have started it
    done_at: dict[int, float] = {}  # overlap: when each average's all-reduce ends
    blocked: dict[int, list[Callable[[], None]]] = {}  # overlap: what waits for an average to end

    def local(r: int) -> None:
        if step[r] == steps:
            job.done(r)
            return
        engine.after(job.calc[r][step[r]] + t_merge, partial(stepped, r))

    def stepped(r: int) -> None:
        step[r] += 1
        if overlap:
            return overlapped(r)
        if n > 1 and (step[r] % k == 0 or step[r] == steps):
            waiting[0] += 1
            if waiting[0] == n:
                waiting[0] = 0
                engine.after(average, resume)
        else:
            local(r)

    def overlapped(r: int) -> None:
        last = step[r] - 1  # the step before this one started an average: take it in now
        if last >= 1 and last % k == 0:
            return take_in(last // k, partial(start_if_due, r))
        start_if_due(r)

    def start_if_due(r: int) -> None:
        if step[r] % k and step[r] < steps:
            return local(r)
        number = step[r] // k if step[r] % k == 0 else -1  # -1: the average after the last step
        arrived[number] = arrived.get(number, 0) + 1
        if arrived[number] == n:
            done_at[number] = engine.now + collective
            for then in blocked.pop(number, []):
                engine.at(done_at[number] + t_merge, then)
        if step[r] == steps:  # nothing left to overlap with: wait for it
            return take_in(number, partial(job.done, r))
        local(r)

    def take_in(number: int, then: Callable[[], None]) -> None:
        if number in done_at:
            engine.at(max(engine.now, done_at[number]) + t_merge, then)
        else:
            blocked.setdefault(number, []).append(then)

    def resume() -> None:
        for r in range(n):
            local(r)

    resume()


def _hierarchical(job: _Job) -> None:
    """All-reduce inside each node, ADPSGD across nodes (``Hierarchical`` in :mod:`asrflow.parallel.gossip`).

    Nodes hold ``group_size`` consecutive learners (the last may hold fewer). Each node acts as
    one ADPSGD super-learner: at the start of its step s its first learner sends the node's
    model to the partner node's first learner (inter-node links; one model per node crosses the
    network). The members compute, meet at a node barrier and all-reduce their gradients
    (intra-node figures, never compressed); once the partner's model is there the first
    learner averages and broadcasts the model inside the node (pipelined chain: ``(m-1) *
    intra_latency + bytes / intra_bandwidth``), and all apply (``t_merge`` covers averaging and
    applying).
    """
    n, g, steps, engine = job.n, job.cfg.group_size, job.cfg.steps, job.engine
    t_merge, net, nbytes = job.cfg.t_merge, job.cfg.network, job.cfg.wire_bytes
    nodes = [list(range(first, min(first + g, n))) for first in range(0, n, g)]
    count = len(nodes)
    reduce = [allreduce_time(len(m), job.cfg.model_bytes, net.intra_bandwidth, net.intra_latency) for m in nodes]
    broadcast = [(len(m) - 1) * net.intra_latency + nbytes / net.intra_bandwidth if len(m) > 1 else 0.0 for m in nodes]
    step = [0] * count
    calculated = [0] * count
    reduced = [False] * count
    mail: set[tuple[int, int]] = set()

    def start(j: int) -> None:
        s = step[j]
        if s == steps:
            for r in nodes[j]:
                job.done(r)
            return
        other = partner(j, count, s)
        if other is not None:
            job.send(nodes[j][0], nodes[other][0], partial(delivered, other, s))
        for r in nodes[j]:
            engine.after(job.calc[r][s], partial(member_calculated, j))

    def member_calculated(j: int) -> None:
        calculated[j] += 1
        if calculated[j] == len(nodes[j]):
            calculated[j] = 0
            engine.after(reduce[j], partial(all_reduced, j))

    def all_reduced(j: int) -> None:
        reduced[j] = True
        try_average(j)

    def delivered(j: int, s: int) -> None:
        mail.add((j, s))
        if step[j] == s:
            try_average(j)

    def try_average(j: int) -> None:
        s = step[j]
        alone = partner(j, count, s) is None
        if reduced[j] and (alone or (j, s) in mail):
            reduced[j] = False
            mail.discard((j, s))
            engine.after((0.0 if alone else broadcast[j]) + t_merge, partial(finished, j))

    def finished(j: int) -> None:
        step[j] += 1
        start(j)

    for node in range(count):
        start(node)


def _asgd(job: _Job) -> None:
    """Parameter-server ASGD as :mod:`asrflow.parallel.server` runs it.

    Learner 0 hosts the server: it applies its own gradients directly (``t_merge`` under the
    server's lock, no wire). Every other learner computes, pushes its gradient and waits for
    the model. The server is one thread serving pushes in arrival order, each in turn:
    receive (wire), apply (``t_merge``, under the lock), send the model back (wire); the
    learner starts its next step on receipt. With one learner there is no server traffic.
    """
    n, steps, engine, t_merge = job.n, job.cfg.steps, job.engine, job.cfg.t_merge
    lock, queue, serving = _Resource(), deque(), [False]
    step = [0] * n

    def compute(r: int) -> None:
        if step[r] == steps:
            job.done(r)
            return
        engine.after(job.calc[r][step[r]], partial(local_apply if r == 0 else push, r))

    def local_apply(r: int) -> None:
        _occupy(engine, (lock,), t_merge, partial(received, r))

    def push(r: int) -> None:
        queue.append(r)
        if not serving[0]:
            serve()

    def serve() -> None:
        serving[0] = bool(queue)
        if queue:
            r = queue.popleft()
            _occupy(engine, (job.outgoing[r], job.incoming[0]), job.wire(r, 0), partial(apply, r))

    def apply(r: int) -> None:
        _occupy(engine, (lock,), t_merge, partial(reply, r))

    def reply(r: int) -> None:
        _occupy(engine, (job.outgoing[0], job.incoming[r]), job.wire(0, r), partial(replied, r))

    def replied(r: int) -> None:
        received(r)
        serve()

    def received(r: int) -> None:
        step[r] += 1
        compute(r)

    for rank in range(n):
        compute(rank)


def _pipeline(job: _Job) -> None:
    """Pipelined back-propagation: learner r holds stage r of the network and all learners' ``steps`` batches
    each (``learners · steps``, the data-parallel strategies' data) flow through the stages in order.

    A stage's part of a batch is ``(t_calc + t_merge) / learners`` (stages balanced), a third of it
    forward, two thirds backward and update. Stage r forwards batch b once stage r − 1's activations of b
    have arrived (stage 0: when it is free), and back-propagates it once stage r + 1's gradient has
    arrived (the last stage: right after its forward pass); a stage runs one pass at a time, a ready
    backward pass first. Activations and gradients are messages of ``model_bytes`` (for this strategy:
    one stage boundary's activations of a batch) over the links. Filling and draining the pipeline are
    played out: that is its bubble.
    """
    n, engine = job.n, job.engine
    batches = n * job.cfg.steps
    part = [[(job.calc[r][b % job.cfg.steps] + job.cfg.t_merge) / n for b in range(batches)] for r in range(n)]
    busy = [False] * n
    ready: list[deque[tuple[str, int]]] = [deque() for _ in range(n)]
    left = [2 * batches] * n  # passes each stage still has to run

    def offer(r: int, kind: str, b: int) -> None:
        (ready[r].appendleft if kind == "backward" else ready[r].append)((kind, b))
        run(r)

    def run(r: int) -> None:
        if busy[r] or not ready[r]:
            return
        backward = [task for task in ready[r] if task[0] == "backward"]
        kind, b = backward[0] if backward else ready[r][0]
        ready[r].remove((kind, b))
        busy[r] = True
        engine.after(part[r][b] * (2 / 3 if kind == "backward" else 1 / 3), partial(finished, r, kind, b))

    def finished(r: int, kind: str, b: int) -> None:
        busy[r] = False
        left[r] -= 1
        if kind == "forward":
            if r == n - 1:
                offer(r, "backward", b)
            else:
                job.send(r, r + 1, partial(offer, r + 1, "forward", b))
            if r == 0 and b + 1 < batches:
                offer(0, "forward", b + 1)
        elif r > 0:
            job.send(r, r - 1, partial(offer, r - 1, "backward", b))
        if left[r] == 0:
            job.done(r)
        run(r)

    offer(0, "forward", 0)


_RUNNERS: dict[str, Callable[[_Job], None]] = {
    "pipeline": _pipeline,
    "ring": _ring,
    "adpsgd": _adpsgd,
    "allreduce": _allreduce,
    "kavg": _kavg,
    "hierarchical": _hierarchical,
    "asgd": _asgd,
}


def simulate(cfg: SimConfig) -> SimResult:
    """Play one run out event by event and return its makespan and speedup over one learner."""
    cfg.validate()
    job = _Job(cfg)
    _RUNNERS[cfg.strategy](job)
    job.engine.run()
    makespan = max(job.finish)
    baseline = cfg.learners * cfg.steps * (cfg.t_calc + cfg.t_merge)
    transmit = cfg.network.wire(cfg.wire_bytes, intra=cfg.single_node)
    return SimResult(
        strategy=cfg.strategy,
        learners=cfg.learners,
        group_size=cfg.group_size,
        makespan=makespan,
        speedup=baseline / makespan if makespan > 0 else math.nan,
        step_time=makespan / cfg.steps,
        transmit=transmit,
        n_max=n_max(StepTimes(calc=cfg.t_calc, transmit=transmit, merge=cfg.t_merge)),
    )


def project(strategy: str, learners: list[int], t_calc: float, t_merge: float, model_bytes: float,
            network: Network | None = None, group_size: int = 1, **kw) -> list[SimResult]:
    """Simulate ``strategy`` for each learner count; ``kw`` are further :class:`SimConfig` fields."""
    network = network if network is not None else Network()
    return [
        simulate(SimConfig(strategy=strategy, learners=n, t_calc=t_calc, t_merge=t_merge, model_bytes=model_bytes,
                           network=network, group_size=group_size, **kw))
        for n in learners
    ]
