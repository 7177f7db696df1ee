"""The parallel-training figures write PNGs for sample rows and for no rows at all."""

from __future__ import annotations

from pathlib import Path

from asrflow.parallel.plots import plot_accuracy, plot_bytes, plot_speedup

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def test_speedup(tmp_path: Path) -> None:
    measured = [{"strategy": s, "learners": n, "measured_speedup": 0.9 * n}
                for s in ("ring", "allreduce") for n in (1, 2)]
    predicted = [{"strategy": "ring", "learners": n, "predicted_speedup": min(n, 4.3)} for n in (1, 2, 4, 8)]
    simulated = [{"strategy": "ring", "learners": n, "speedup": min(n, 4.2)} for n in (1, 2, 4, 8, 64)]
    simulated.append({"strategy": "hierarchical", "learners": 64, "group_size": 8, "speedup": 60.0})
    simulated.append({"strategy": "asgd", "learners": 2, "speedup": float("nan")})
    assert is_png(plot_speedup(measured, predicted, simulated, tmp_path / "speedup.png"))
    assert is_png(plot_speedup(measured, [], [], tmp_path / "measured_only.png"))
    assert is_png(plot_speedup([], [], [], tmp_path / "sub" / "empty.png"))


def test_accuracy(tmp_path: Path) -> None:
    rows = [{"strategy": "kavg", "learners": n, "valid_frame_accuracy": 0.6 - 0.01 * n, "source": "emulated"}
            for n in (1, 2, 4, 8)]
    rows += [{"strategy": "ring", "learners": 2, "valid_frame_accuracy": 0.58, "source": "measured"},
             {"strategy": "ring", "learners": 1, "valid_frame_accuracy": 0.6}]
    assert is_png(plot_accuracy(rows, tmp_path / "accuracy.png"))
    assert is_png(plot_accuracy([], tmp_path / "empty.png"))


def test_bytes(tmp_path: Path) -> None:
    rows = [{"strategy": s, "compression": c, "bytes_per_step": b / f}
            for s, b in (("ring", 2.4e6), ("allreduce", 4.8e6)) for c, f in (("none", 1), ("8bit", 4), ("1bit", 32))]
    rows.append({"strategy": "asgd", "compression": "none", "bytes_per_step": 0})
    assert is_png(plot_bytes(rows, tmp_path / "bytes.png"))
    assert is_png(plot_bytes([], tmp_path / "empty.png"))
