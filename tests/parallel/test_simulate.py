"""The discrete-event simulator: limits it must reproduce and orderings between strategies."""

from __future__ import annotations

import pytest

from asrflow.parallel.simulate import STRATEGIES, Network, SimConfig, project, simulate
from asrflow.parallel.timing import StepTimes, n_max

T_CALC, T_MERGE = 0.1, 0.005
SLOW = Network(bandwidth=1.25e8, latency=5e-5)  # 1 Gbit/s between nodes
RING_BYTES = (0.0055 - 5e-5) * 1.25e8  # wire 5.5 ms on SLOW: n_max = 0.105 / 0.0105 = 10


def run(strategy: str, learners: int, model_bytes: float = 2.4e6, network: Network = SLOW, **kw) -> float:
    """Simulated speedup with the module's step times."""
    return simulate(SimConfig(strategy, learners, T_CALC, T_MERGE, model_bytes, network, **kw)).speedup


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_one_learner_is_the_baseline(strategy: str) -> None:
    assert run(strategy, 1, steps=50) == pytest.approx(1.0, abs=1e-9)
    assert run(strategy, 1, steps=50, jitter=0.3) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("learners", [2, 4, 8, 10, 12, 32, 64])
def test_ring_saturates_at_n_max(learners: int) -> None:
    result = simulate(SimConfig("ring", learners, T_CALC, T_MERGE, RING_BYTES, SLOW))
    limit = n_max(StepTimes(calc=T_CALC, transmit=result.transmit, merge=T_MERGE))
    assert result.n_max == pytest.approx(limit) and limit == pytest.approx(10.0)
    assert result.speedup == pytest.approx(min(learners, limit), rel=0.05)
    assert result.speedup <= min(learners, limit) * 1.0001


def test_allreduce_loses_to_ring_when_transmit_is_large() -> None:
    # wire 19 ms: ring overlaps it (4 learners < n_max 4.3), all-reduce adds 1.5 wires to every step
    assert run("allreduce", 4) < 0.85 * run("ring", 4)


def test_kavg_sits_between_allreduce_and_linear() -> None:
    kavg = run("kavg", 16, k=8)
    assert run("allreduce", 16) < kavg < 16


def test_overlapped_kavg_hides_the_barrier_and_the_all_reduce() -> None:
    kw = dict(k=4, steps=200, jitter=0.3, seed=2)
    blocking, overlapped = run("kavg", 4, **kw), run("kavg", 4, overlap=True, **kw)
    assert blocking < overlapped <= 4.0001
    # without jitter it saves the all-reduce: every average costs one merge (the last one waits for it)
    plain = simulate(SimConfig("kavg", 2, T_CALC, T_MERGE, 2.4e6, SLOW, k=4, steps=40, overlap=True))
    assert plain.speedup == pytest.approx(2 * (T_CALC + T_MERGE) / (T_CALC + T_MERGE + T_MERGE / 4), rel=0.01)
    assert plain.speedup > run("kavg", 2, k=4, steps=40)
    assert run("kavg", 1, overlap=True, steps=50) == pytest.approx(1.0, abs=1e-9)


def test_hierarchical_beats_flat_schemes_on_a_slow_network() -> None:
    slow = Network(bandwidth=1.25e7, latency=5e-5, intra_bandwidth=2.5e10)  # 100 Mbit/s: a model takes 192 ms
    hierarchical = run("hierarchical", 64, network=slow, group_size=8, steps=60)
    assert hierarchical > 2 * run("allreduce", 64, network=slow, steps=60)
    assert hierarchical > 2 * run("allreduce", 64, network=slow, group_size=8, steps=60)
    assert hierarchical > 5 * run("ring", 64, network=slow, steps=60)
    # one model per node crosses the network, so it keeps pace with flat ADPSGD (every learner has its own link)
    assert hierarchical == pytest.approx(run("adpsgd", 64, network=slow, steps=60), rel=0.02)


def test_degenerate_hierarchies() -> None:
    kw = dict(steps=40, jitter=0.2, seed=3)
    assert run("hierarchical", 8, group_size=1, **kw) == pytest.approx(run("adpsgd", 8, **kw))
    assert run("hierarchical", 8, group_size=8, **kw) == pytest.approx(run("allreduce", 8, group_size=8, **kw))


def test_jitter_hurts_allreduce_more_than_adpsgd() -> None:
    fast = Network()

    def loss(strategy: str) -> float:
        jittered = run(strategy, 16, network=fast, jitter=0.3, seed=1, steps=100)
        return jittered / run(strategy, 16, network=fast, steps=100)

    assert loss("allreduce") < loss("adpsgd") - 0.15
    assert loss("adpsgd") < 1.0


def test_compression_raises_n_max() -> None:
    plain = simulate(SimConfig("ring", 32, T_CALC, T_MERGE, 2.4e6, SLOW))
    packed = simulate(SimConfig("ring", 32, T_CALC, T_MERGE, 2.4e6, SLOW, compression=32))
    assert packed.n_max > 4 * plain.n_max
    assert packed.speedup == pytest.approx(packed.n_max, rel=0.05)
    assert plain.speedup == pytest.approx(plain.n_max, rel=0.05)


def test_compressed_averages_are_all_gathers() -> None:
    # ring: 32x fewer bytes per hop; all-reduce: the all-gather of 63 payloads of 1/32 costs about as much as before
    assert run("ring", 64, compression=32, steps=50) > 4 * run("ring", 64, steps=50)
    assert run("allreduce", 64, compression=32, steps=50) < 1.05 * run("allreduce", 64, steps=50)
    assert run("allreduce", 4, compression=32, steps=50) > 1.2 * run("allreduce", 4, steps=50)


def test_asgd_saturates_at_its_server() -> None:
    results = project("asgd", [4, 32, 64], T_CALC, T_MERGE, 2.4e6, SLOW, steps=100)
    wire = results[0].transmit
    limit = (T_CALC + T_MERGE) / (2 * wire + T_MERGE)  # one server thread: receive, apply, send back
    assert results[2].speedup == pytest.approx(results[1].speedup, rel=0.03)
    assert results[2].speedup == pytest.approx(limit, rel=0.05)
    ring = project("ring", [4, 64], T_CALC, T_MERGE, 2.4e6, SLOW, steps=100)
    assert results[0].speedup < 0.8 * ring[0].speedup  # the ring overlaps its transmission, asgd waits a round trip
    assert results[2].speedup < 0.7 * ring[1].speedup


def test_deterministic_given_seed() -> None:
    config = dict(strategy="adpsgd", learners=6, t_calc=T_CALC, t_merge=T_MERGE, model_bytes=2.4e6, jitter=0.2,
                  steps=50)
    first, again = simulate(SimConfig(**config, seed=7)), simulate(SimConfig(**config, seed=7))
    assert first == again
    assert simulate(SimConfig(**config, seed=8)).makespan != first.makespan


def test_project_and_result_rows() -> None:
    results = project("ring", [1, 2], T_CALC, T_MERGE, 2.4e6, steps=20)
    assert [r.learners for r in results] == [1, 2]
    row = results[1].as_dict()
    assert set(row) == {"strategy", "learners", "group_size", "makespan", "speedup", "step_time", "transmit", "n_max"}
    assert row["step_time"] == pytest.approx(row["makespan"] / 20)


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        simulate(SimConfig("gossip", 2, T_CALC, T_MERGE, 1.0))
    with pytest.raises(ValueError, match="learners"):
        simulate(SimConfig("ring", 0, T_CALC, T_MERGE, 1.0))


def test_the_pipeline_scales_with_stages_and_beats_data_parallelism_only_for_large_models_on_slow_links() -> None:
    """Stages balanced and the links free: nearly one stage's part per batch, less the bubble. Data parallelism
    sends the model every step, the pipeline a boundary's activations: the model's size against the batch's
    activations, and the link, decide which is faster."""
    from asrflow.parallel.simulate import Network, SimConfig, simulate

    free = Network(bandwidth=1e15, latency=0.0, intra_bandwidth=1e15, intra_latency=0.0)
    four = simulate(SimConfig(strategy="pipeline", learners=4, t_calc=1.0, t_merge=0.0, model_bytes=0, steps=50,
                              network=free))
    assert 3.7 < four.speedup < 4.0
    slow = Network(bandwidth=1.25e8)  # 1 Gbit/s between nodes
    activations = 2000 * 2048 * 4  # 2,000 frames of a 2,048-wide layer

    def speedup(strategy: str, model_bytes: float) -> float:
        return simulate(SimConfig(strategy=strategy, learners=4, t_calc=1.0, t_merge=0.05, model_bytes=model_bytes,
                                  steps=30, network=slow)).speedup

    assert speedup("pipeline", activations) > speedup("allreduce", 28e6 * 4)  # a 28 M-parameter model
    assert speedup("pipeline", activations) < speedup("allreduce", 0.5e6 * 4)  # a 0.5 M-parameter model
