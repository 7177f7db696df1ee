"""Feature-extraction benchmark: asrflow on 1..N Dask workers vs kaldi-native-fbank, same audio.

Every timed run is end to end — read audio, compute, write the ark/scp archives (and, for
asrflow, the per-split index and CMVN) — on the utterances of a data stage's ``all`` dir.
Cluster start-up is excluded (it is paid once per stage, ~1-2 s) and reported separately.
Agreement with kaldi-native-fbank (dither off, same options) is measured on the same audio.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.cluster import dask_client
from asrflow.data.datadir import read_data_dir
from asrflow.features.ark import write_ark
from asrflow.features.compute import FeatureOptions, compute
from asrflow.features.stage import extract_features, load_signal


def kaldi_native_fbank(opts: FeatureOptions):
    """A function computing kaldi-native-fbank features with the same options (the reference)."""
    import kaldi_native_fbank as knf

    if opts.kind == "mfcc":
        o = knf.MfccOptions()
        o.num_ceps, o.cepstral_lifter, o.use_energy = opts.num_ceps, opts.cepstral_lifter, opts.use_energy
    else:
        o = knf.FbankOptions()
        o.use_energy = opts.use_energy
    o.mel_opts.num_bins, o.mel_opts.low_freq, o.mel_opts.high_freq = opts.num_mel_bins, opts.low_freq, opts.high_freq
    f = o.frame_opts
    f.samp_freq, f.dither, f.snip_edges, f.window_type = opts.sample_rate, opts.dither, opts.snip_edges, opts.window
    f.frame_length_ms, f.frame_shift_ms, f.preemph_coeff = opts.frame_length_ms, opts.frame_shift_ms, opts.preemphasis
    f.remove_dc_offset = opts.remove_dc_offset

    def run(samples: np.ndarray) -> np.ndarray:
        comp = knf.OnlineMfcc(o) if opts.kind == "mfcc" else knf.OnlineFbank(o)
        comp.accept_waveform(opts.sample_rate, samples)
        comp.input_finished()
        return np.array([comp.get_frame(i) for i in range(comp.num_frames_ready)], dtype=np.float32)

    return run


def time_knf(utts, opts: FeatureOptions, out: Path) -> float:
    """kaldi-native-fbank end to end in one process: read, compute, write one ark."""
    run = kaldi_native_fbank(opts)
    start = time.perf_counter()
    write_ark(out / "knf.ark", ((u.utt_id, run(load_signal(u, opts.sample_rate).tolist())) for u in utts))
    return time.perf_counter() - start


def agreement(utts, opts: FeatureOptions) -> dict[str, float]:
    """Max / mean absolute difference and correlation against kaldi-native-fbank (no dither)."""
    plain = FeatureOptions(**{**opts.__dict__, "dither": 0.0})
    run = kaldi_native_fbank(plain)
    diffs, ours_all, ref_all = [], [], []
    for u in utts:
        samples = load_signal(u, plain.sample_rate)
        ours, ref = compute(samples, plain), run(samples.tolist())
        diffs.append(np.abs(ours - ref).ravel())
        ours_all.append(ours.ravel())
        ref_all.append(ref.ravel())
    d, a, b = np.concatenate(diffs), np.concatenate(ours_all), np.concatenate(ref_all)
    return {"max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()),
            "p99_abs_diff": float(np.quantile(d, 0.99)), "correlation": float(np.corrcoef(a, b)[0, 1]),
            "values": int(d.size)}


def run_benchmark(config: dict[str, Any], data_dir: str | Path, workers: list[int], out: str | Path | None,
                  repeats: int = 3, log=print) -> dict[str, Any]:
    """Time every feature kind with each worker count and kaldi-native-fbank; measure agreement."""
    data_dir = Path(data_dir)
    utts = read_data_dir(data_dir / "all")
    audio_seconds = sum(u.duration for u in utts)
    report: dict[str, Any] = {"utterances": len(utts), "audio_seconds": round(audio_seconds, 1),
                              "repeats": repeats, "machine": f"{platform.processor() or platform.machine()}",
                              "kinds": {}}
    quiet = lambda *_: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="asrflow-bench-") as tmp:
        tmp = Path(tmp)
        for kind in config["features"]["kinds"]:
            opts = FeatureOptions.from_config(config["features"], kind, config["audio"]["sample_rate"])
            row: dict[str, Any] = {"dim": opts.dim, "asrflow": {}}
            for n in workers:
                t0 = time.perf_counter()
                with dask_client({**config["dask"], "workers": n, "dashboard": False, "single_worker_thread": False},
                                 log=quiet) as client:  # worker processes at every count, so 1 and 2 compare
                    startup = time.perf_counter() - t0
                    runs = []
                    for _ in range(repeats):
                        target = tmp / f"{kind}-{n}"
                        shutil.rmtree(target, ignore_errors=True)
                        runs.append(extract_features(config, data_dir, kind, target, client, n, log=quiet))
                best = min(runs, key=lambda r: r.wall_seconds)
                xrt = audio_seconds / best.wall_seconds
                row["asrflow"][n] = {"seconds": round(best.wall_seconds, 3), "x_real_time": round(xrt),
                                     "x_real_time_per_worker": round(xrt / n),
                                     "in_task_x_real_time": round(audio_seconds / best.task_seconds),
                                     "parallel_phase_seconds": round(best.compute_seconds, 3),
                                     "cluster_startup_seconds": round(startup, 2)}
                log(f"{kind} asrflow {n} worker(s): {best.wall_seconds:.2f} s, {xrt:.0f}x real time, "
                    f"{xrt / n:.0f}x per worker, {audio_seconds / best.task_seconds:.0f}x inside tasks")
            knf_best = min(time_knf(utts, FeatureOptions(**{**opts.__dict__}), tmp) for _ in range(repeats))
            row["kaldi_native_fbank"] = {"seconds": round(knf_best, 3),
                                         "x_real_time": round(audio_seconds / knf_best)}
            log(f"{kind} kaldi-native-fbank 1 process: {knf_best:.2f} s, {audio_seconds / knf_best:.0f}x real time")
            one = row["asrflow"][workers[0]]["seconds"]
            row["speedup"] = {n: round(one / v["seconds"], 2) for n, v in row["asrflow"].items()}
            first = row["asrflow"][workers[0]]["parallel_phase_seconds"]
            row["parallel_phase_speedup"] = {n: round(first / v["parallel_phase_seconds"], 2)
                                             for n, v in row["asrflow"].items()}
            row["vs_kaldi_native_fbank_per_worker"] = round(
                knf_best / row["asrflow"][workers[0]]["seconds"] / workers[0], 2)
            row["agreement"] = agreement(utts[: min(300, len(utts))], opts)
            log(f"{kind} agreement with kaldi-native-fbank: {row['agreement']}")
            report["kinds"][kind] = row
    if out:
        import json

        Path(out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    report["table"] = markdown(report, workers)
    log(report["table"])
    return report


def markdown(report: dict[str, Any], workers: list[int]) -> str:
    """A Markdown table of the benchmark."""
    lines = ["| kind | setting | seconds | x real time | x real time per worker | x real time inside tasks "
             "| speedup vs first (stage / parallel phase) |",
             "|---|---|---|---|---|---|---|"]
    for kind, row in report["kinds"].items():
        for n in workers:
            r = row["asrflow"][n]
            lines.append(f"| {kind} | asrflow, {n} Dask worker(s) | {r['seconds']} | {r['x_real_time']} | "
                         f"{r['x_real_time_per_worker']} | {r['in_task_x_real_time']} | "
                         f"{row['speedup'][n]} / {row['parallel_phase_speedup'][n]} |")
        k = row["kaldi_native_fbank"]
        lines.append(f"| {kind} | kaldi-native-fbank, 1 process | {k['seconds']} | {k['x_real_time']} | "
                     f"{k['x_real_time']} | | |")
    lines += ["", "| kind | max abs diff | p99 abs diff | mean abs diff | correlation | values |",
              "|---|---|---|---|---|---|"]
    for kind, row in report["kinds"].items():
        a = row["agreement"]
        lines.append(f"| {kind} | {a['max_abs_diff']:.2e} | {a['p99_abs_diff']:.2e} | {a['mean_abs_diff']:.2e} | "
                     f"{a['correlation']:.9f} | {a['values']} |")
    return "\n".join(lines)
