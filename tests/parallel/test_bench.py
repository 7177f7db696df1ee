"""``asrflow bench parallel`` on a fixed amount of work: warm-up left out, a synthetic split that gives every
learner the same number of minibatches, pinned learners, and the pairs' median with its spread."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from asrflow.parallel.bench import StepClock, bench_parallel, spread, synthetic_frames, throughput
from tests.conftest import REPO


def test_the_median_comes_with_its_spread_and_says_when_the_spread_hides_the_gap() -> None:
    row = spread([1.80, 1.92, 1.85, 1.60, 1.91], predicted=2.0)
    assert row["measured_speedup"] == 1.85 and row["pairs"] == 5
    assert (row["speedup_min"], row["speedup_max"]) == (1.60, 1.92)
    assert row["speedup_iqr"] == pytest.approx([1.80, 1.91])
    assert row["gap_to_predicted"] == pytest.approx(1.85 / 2.0 - 1)
    assert row["spread_exceeds_gap"]  # 0.32 wide against a gap of 0.15: the run cannot claim the gap
    assert not row["spread_exceeds_gain"]  # but it does show a speedup
    tight = spread([1.70, 1.71, 1.72, 1.70], predicted=2.0)
    assert tight["measured_speedup"] == 1.70  # the lower middle pair for an even count
    assert not tight["spread_exceeds_gap"]
    assert spread([0.9, 1.3, 1.1], predicted=2.0)["spread_exceeds_gain"]


def test_the_clock_times_the_steps_after_the_warm_up_only() -> None:
    one = StepClock(warmup=2, world=1)
    for step in range(1, 6):
        one.add(step, {"step_seconds": 10.0 if step <= 2 else 1.0, "frames_per_second": 800.0})
    one.add(5, {"valid_loss": 1.0, "epoch": 0})  # a held-out evaluation is not a step
    timed = one.summary()
    assert (timed["steps"], timed["seconds"], timed["frames"], timed["work"]) == (3, 3.0, 2400.0, 3.0)
    two = StepClock(warmup=0, world=2)
    two.add(1, {"step_seconds": 1.0, "frames_per_second": 1600.0, "t_data": 0.1, "t_calc": 0.6, "t_merge": 0.1,
                "t_transmit": 0.2, "t_wait": 0.0, "bytes_per_step": 100.0})
    timed = two.summary()
    assert timed["frames"] == 800.0 and timed["work"] == pytest.approx(0.8)  # exchanging is not local work
    assert timed["mean_t_calc"] == 0.6 and timed["mean_bytes_per_step"] == 100.0


def test_a_synthetic_split_holds_the_same_minibatches_per_learner_for_any_count() -> None:
    # 1,000-frame minibatches of 400-frame utterances: two utterances each
    assert synthetic_frames(10, 2, 1, 1000, 400, "learner") == 12 * 2 * 400
    assert synthetic_frames(10, 2, 2, 1000, 400, "learner") == 2 * 12 * 2 * 400
    assert synthetic_frames(10, 2, 2, 1000, 400, "global") == 2 * 12 * 1 * 400  # 500 frames a learner: one each


def test_throughput_is_every_learners_frames_over_the_slowest() -> None:
    fast, slow = ({"timed": {"frames": 1000.0, "seconds": s}, "train_seconds": 9.0} for s in (1.0, 2.0))
    assert throughput([fast, slow]) == 1000.0
    assert throughput([{"train_seconds": 4.0}]) == 0.25  # epochs of the same data: inverse time


@pytest.mark.slow  # learner processes under torchrun
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two learners need two cores")
def test_the_bench_gives_every_learner_its_steps_pinned_and_reports_the_spread(tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(json.dumps({
        "experiment": "bench", "results_dir": str(tmp_path / "results"),
        "nnet": {"train": {"max_frames": 800, "epochs": 1, "warmup_steps": 1},
                 "models": {"tiny": {"type": "dnn", "hidden": 32, "layers": 1, "context": 1}}},
        "evaluation": {"systems": ["tiny"]}}))
    logged: list[str] = []
    files = [str(REPO / "config" / "config.yaml"), str(config)]
    first, rows = bench_parallel(files, "tiny", {}, [{"strategy": "ring", "batch": "learner"}], [1, 2], epochs=1,
                                 repeats=1, log=logged.append, warmup=2, pin=True, steps=3, length=400)
    assert first["timed"]["steps"] == 3 and first["timed"]["warmup"] == 2 and first["pinned"] == 0
    assert first["steps"] == 5 and first["timed"]["frames"] == pytest.approx(3 * 800, rel=1e-6)
    row = rows[0]
    assert row["timed_steps"] == 3 and row["warmup_steps"] == 2 and row["pinned"] == 0 and row["threads"] == 1
    assert row["pairs"] == 1 and row["speedup_min"] == row["measured_speedup"] == row["speedup_max"]
    assert row["measured_speedup"] > 0 and row["predicted_speedup"] > 1 and row["t_calc"] > 0
    assert row["bytes_per_step"] > 0 and isinstance(row["spread_exceeds_gap"], bool)
    assert sum(line.startswith("  pair") for line in logged) == 1


def test_the_command_needs_a_corpus_split_or_steps() -> None:
    from asrflow.cli import main

    config = str(REPO / "config" / "config.yaml")
    with pytest.raises(SystemExit, match="--data, --features and --gmm .* or --steps"):
        main(["bench", "parallel", "-c", config])
    with pytest.raises(SystemExit, match="--emulate-learners none"):
        main(["bench", "parallel", "-c", config, "--steps", "3", "--study"])
