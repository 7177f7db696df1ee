"""The timing model, the bench rows and the study's tables and figures (no processes started)."""

from __future__ import annotations

import json
import math

import pytest

from asrflow.cli import main
from asrflow.parallel.bench import bench_row, table
from asrflow.parallel.study import predicted_rows, simulated_rows, summary_markdown, write_figures
from asrflow.parallel.timing import StepTimes, n_max, predict_speedup


def test_rsps_model_scales_linearly_then_saturates_at_n_max() -> None:
    times = StepTimes(calc=0.1, transmit=0.02, merge=0.005)
    assert n_max(times) == pytest.approx(0.105 / 0.025)
    assert predict_speedup("ring", 2, times) == 2.0
    assert predict_speedup("ring", 4, times) == 4.0
    assert predict_speedup("ring", 64, times) == pytest.approx(4.2)
    assert predict_speedup("ring", 1, times) == 1.0


def test_blocking_exchanges_pay_the_wire_every_step_and_asgd_saturates_at_the_server() -> None:
    times = StepTimes(calc=0.1, transmit=0.02, merge=0.005)
    assert predict_speedup("allreduce", 2, times) == pytest.approx(2 * 0.105 / 0.125)
    assert predict_speedup("kavg", 2, StepTimes(calc=0.1, transmit=0.005, merge=0.005)) > \
        predict_speedup("allreduce", 2, times)
    assert predict_speedup("adpsgd", 8, times) == pytest.approx(8.0)  # the exchange hides behind the computation
    assert predict_speedup("asgd", 64, times) == pytest.approx(0.105 / 0.045)
    with pytest.raises(ValueError, match="unknown strategy"):
        predict_speedup("gossip", 2, times)


@pytest.mark.parametrize("pairing", ["before", "concurrent"])
def test_bench_pairs_each_parallel_run_with_a_single_learner(pairing: str, tmp_path, monkeypatch) -> None:
    """``before``: the single learner runs first (the first pair reuses the opening run); ``concurrent``: at the
    same time as the parallel run. Every run gets its own numbered trace."""
    import threading
    import time

    import asrflow.parallel.bench as bench

    calls, running, overlaps, pins = [], [], [], []
    lock = threading.Lock()

    def fake_run(config_files, system, paths, parallel, epochs, threads, timeout=3600, trace=None, warmup=0,
                 pin_from=None):
        with lock:
            calls.append((parallel["learners"], trace.name))
            pins.append((parallel["learners"], pin_from))
            overlaps.append(len(running))
            running.append(parallel["learners"])
        time.sleep(0.05)
        with lock:
            running.remove(parallel["learners"])
        n = parallel["learners"]
        return [_summary(40.0 if n == 1 else 21.0, 0.2, 0.001, 0.006, 2e6)] * n

    monkeypatch.setattr(bench, "run_learners", fake_run)
    logged: list[str] = []
    first, rows = bench.bench_parallel(["c.yaml"], "dnn", {}, [{"strategy": "ring", "batch": "learner"}], [1, 2],
                                       epochs=1, repeats=3, log=logged.append, trace_dir=tmp_path, pairing=pairing,
                                       pin=True)
    singles = sum(1 for n, _ in calls if n == 1)
    assert singles == (4 if pairing == "concurrent" else 3)  # the opening run, then one per pair (the first reused)
    assert (max(overlaps) == 1) == (pairing == "concurrent")
    assert len({name for _, name in calls}) == len(calls) and all(name[:3].isdigit() for _, name in calls)
    assert rows[0]["measured_speedups"] == [pytest.approx(40 / 21, abs=1e-3)] * 3 and rows[0]["pairing"] == pairing
    assert rows[0]["speedup_min"] == rows[0]["speedup_max"] and rows[0]["pairs"] == 3
    # pinned: the parallel learners from core 0; a concurrent single learner on the core after theirs
    assert {pin for n, pin in pins if n == 2} == {0}
    assert {pin for n, pin in pins if n == 1} == ({0, 2} if pairing == "concurrent" else {0})
    assert sum(f"({pairing})" in line for line in logged) == 3
    with pytest.raises(ValueError, match="pairing"):
        bench.bench_parallel(["c.yaml"], "dnn", {}, [], [1], epochs=1, pairing="after")


def test_step_times_round_trip_through_their_dict() -> None:
    times = StepTimes(calc=1, transmit=2, merge=3, wait=4, data=5, bytes=6)
    assert StepTimes.from_dict(times.as_dict()) == times
    assert set(times.as_dict()) >= {"t_calc", "t_transmit", "t_merge", "bytes_per_step"}


def _summary(seconds: float, calc: float, transmit: float, merge: float, nbytes: float, steps: int = 100) -> dict:
    return {"train_seconds": seconds, "mean_t_calc": calc, "mean_t_data": 0.0, "mean_t_transmit": transmit,
            "mean_t_merge": merge, "mean_t_wait": 0.0, "mean_bytes_per_step": nbytes,
            "best_valid_frame_accuracy": 0.7, "steps": steps}


def test_bench_rows_measure_against_the_slowest_learner() -> None:
    baseline = _summary(100.0, 0.2, 0.0, 0.005, 0.0)
    row = bench_row("ring", [_summary(52.0, 0.2, 0.001, 0.006, 2e6, 50), _summary(50.0, 0.2, 0.001, 0.006, 2e6, 50)],
                    baseline, {"strategy": "ring", "learners": 2, "batch": "learner"})
    assert row["learners"] == 2 and row["measured_speedup"] == pytest.approx(100 / 52)
    assert row["predicted_speedup"] == 2.0 and row["bytes_per_step"] == 2e6
    assert "ring" in table([row]) and "1.92" in table([row])
    # each learner took half the steps at the single learner's step cost: the work split (almost) perfectly
    assert row["split_efficiency"] == pytest.approx(0.205 * 100 / (2 * 0.206 * 50))
    assert row["predicted_split"] == pytest.approx(2.0 * row["split_efficiency"]) and row["batch"] == "learner"
    # batch global: as many steps as one learner, each on half the batch but costing 0.15 s of 0.205
    halves = bench_row("ring", [_summary(60.0, 0.145, 0.001, 0.005, 2e6)] * 2, baseline, {"strategy": "ring"})
    assert halves["split_efficiency"] == pytest.approx(0.205 / 0.3) and halves["batch"] == "global"


def test_study_tables_and_figures(tmp_path) -> None:
    baseline = _summary(100.0, 0.2, 0.0, 0.005, 0.0)
    bench = [bench_row(s, [_summary(55.0, 0.2, t, 0.006, b)] * 2, baseline, {"strategy": s, "compression": c})
             for s, t, b, c in (("ring", 0.001, 2e6, "none"), ("allreduce", 0.03, 2e6, "none"),
                                ("hierarchical", 0.0, 2e6, "none"), ("ring", 0.001, 6e4, "1bit"))]
    predicted = predicted_rows(bench, [1, 2, 4])
    assert {(r["strategy"], r["learners"]) for r in predicted} == {(s, n) for s in ("ring", "allreduce", "hierarchical")
                                                                   for n in (1, 2, 4)}
    from asrflow.parallel.simulate import Network

    simulated = simulated_rows(bench, [1, 2, 4, 8], Network(), group_size=4, steps=20)
    nodes = {r["strategy"] for r in simulated if r["group_size"] == 4}  # the in-node layout: hierarchical only
    assert nodes == {"hierarchical"} and all(r["model_bytes"] == 2e6 for r in simulated)
    emulated = [{"strategy": "ring", "learners": n, "compression": "none", "valid_frame_accuracy": 0.7 - 0.01 * n}
                for n in (1, 2)]
    for path in write_figures(tmp_path, bench, predicted, simulated, emulated, 0.7):
        assert path.stat().st_size > 1000
    text = summary_markdown(bench, baseline, simulated, emulated)
    assert "Simulated speedup" in text and "| ring | none | 69.00 | 68.00 |" in text


def test_predict_command_prints_the_curve(capsys) -> None:
    assert main(["parallel", "predict", "--t-calc", "0.1", "--t-transmit", "0.02", "--t-merge", "0.005",
                 "--strategy", "ring", "--learners", "1,2,8"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["predicted_speedup"] for r in lines] == [1.0, 2.0, pytest.approx(4.2)]


def test_a_global_batch_is_split_over_the_learners_and_sequential_updates_scale_the_rate() -> None:
    from asrflow.config.settings import Parallel

    assert Parallel.defaults(strategy="allreduce").learner_frames(4000, 2) == 2000
    assert Parallel.defaults(strategy="ring").learner_frames(4000, 1) == 4000
    assert Parallel.defaults(strategy="kavg", batch="learner").learner_frames(4000, 4) == 4000
    assert Parallel.defaults(strategy="ring").lr_factor(4) == 0.5
    assert Parallel.defaults(strategy="asgd").lr_factor(1) == 1
    assert Parallel.defaults(strategy="adpsgd").lr_factor(4) == 1.0
    assert Parallel.defaults(strategy="asgd", stale_lr="linear").lr_factor(4) == 0.25
    assert Parallel.defaults(strategy="kavg", stale_lr="linear").lr_factor(4) == 1.0
    assert Parallel.defaults(strategy="ring", stale_lr="linear", batch="learner").lr_factor(4) == 1.0
    assert Parallel.defaults(strategy="ring", stale_lr="none").lr_factor(4) == 1.0
    pipeline = Parallel.defaults(strategy="pipeline", stale_lr="linear")  # stage s: 2 (P - 1 - s) updates stale
    assert [pipeline.lr_factor(3, s) for s in range(3)] == [0.2, pytest.approx(1 / 3), 1.0]
    assert Parallel.defaults(strategy="pipeline").lr_factor(2, 0) == pytest.approx(1 / math.sqrt(3))
    assert Parallel.defaults(strategy="pipeline", stale_lr="none").lr_factor(2, 0) == 1.0


def test_pipeline_speedup_is_the_slowest_stage_and_the_bubble() -> None:
    from asrflow.parallel.timing import pipeline_speedup

    assert pipeline_speedup([0.5, 0.5]) == pytest.approx(2.0)
    assert pipeline_speedup([0.6, 0.4]) == pytest.approx(1 / 0.6)
    assert pipeline_speedup([0.5, 0.5], batches=10) == pytest.approx(2.0 / 1.2)  # 2 (S - 1) ticks to fill and drain
    assert pipeline_speedup([0.5, 0.5], transmit=0.5) == pytest.approx(1.0)
    assert pipeline_speedup([1.0]) == 1.0
