"""The comparison table of an experiment's systems, built from its MLflow stage runs.

One row per system: the settings that differ between systems, WER and SER on each test
set (and the mean over leave-one-speaker-out folds when there are any), training time and
throughput on the first test set's training split, mean decoding RTF and parameter count; for
networks, the size of ``final.pt`` on disk and the WER of the tune stage on their held-out utterances. The model,
objective and size settings come from the training run's params, so two experiments that
differ only in a network's width show it in the table.
"""

from __future__ import annotations

import ast
import csv
import io
from dataclasses import dataclass, field

from asrflow.config import CHAIN, SAT_SOURCES
from asrflow.data.perturb import SUFFIX as SPEED_PERTURBED
from asrflow.tracking.query import RunRecord

#: the gmm.<system> settings shown for a GMM system (and its <system>_fmllr decoding)
GMM_SIZES = {"mono": ("gaussians",), "tri": ("leaves", "gaussians"), "lda": ("leaves", "gaussians", "dim"),
             "sat": ("leaves", "gaussians")}
PARALLEL_TIMES = ("t_calc", "t_transmit", "t_merge", "t_wait", "bytes_per_step")
#: the tune stage's figures (held-out utterances, the chosen decoder setting), as columns
TUNED_COLUMNS = {"held_out_wer": "held-out WER %"}
NNET_SIZES = ("preset", "hidden", "dim", "heads", "ffn_dim", "kernel", "layers", "context", "bidirectional",
              "projection", "channels", "tdnn_dim", "tdnn_dilations", "subsampling", "multi_frame", "units",
              "vocab_size", "members", "combine")


@dataclass
class SystemRow:
    system: str
    settings: dict[str, str]
    wer: dict[str, float] = field(default_factory=dict)
    ser: dict[str, float] = field(default_factory=dict)
    rtf: list[float] = field(default_factory=list)
    train_seconds: float | None = None
    parameters: float | None = None
    model_bytes: float | None = None  # final.pt on disk (networks)
    frames_per_second: float | None = None  # training throughput (networks)
    frame_accuracy: float | None = None  # best held-out frame accuracy (hybrid networks)
    held_out_wer: float | None = None  # the tune stage's: its held-out utterances, with the chosen setting
    step_times: dict[str, float] = field(default_factory=dict)  # mean t_calc, t_transmit, t_merge, bytes (learners > 1)
    run_id: str | None = None  # the training run (for its curves)

    @property
    def is_network(self) -> bool:
        return self.system.removesuffix("_fmllr") not in GMM_SIZES


def _settings(system: str, params: dict[str, str]) -> dict[str, str]:
    """``model``, ``objective`` and the size settings of a system, from its training run's params."""
    gmm = system.removesuffix("_fmllr")
    if gmm in GMM_SIZES:
        prefix, keys = f"gmm.{gmm}.", GMM_SIZES[gmm]
        objective = "ML, speaker-adaptive training" if gmm in SAT_SOURCES else \
            "ML, LDA+MLLT features" if gmm == "lda" else "ML"
        return {"model": f"gmm-hmm ({gmm})", "objective": objective + (", fMLLR features" if gmm != system else ""),
                "sizes": ", ".join(f"{k}={params[prefix + k]}" for k in keys if prefix + k in params)}
    prefix = f"nnet.models.{system}."
    objective = params.get(f"{prefix}objective", "hybrid")
    sizes = [f"{k}={params[prefix + k]}" for k in NNET_SIZES if prefix + k in params
             and not (objective == "hybrid" and k in ("units", "vocab_size"))
             and not (k == "vocab_size" and params.get(prefix + "units") in ("char", "phone"))
             and not (k == "multi_frame" and params[prefix + k] == "1")]
    if params.get("nnet.effective.train_data", "").endswith(SPEED_PERTURBED):
        objective += ", speed-perturbed data"
    objective += _mmi_label(params.get("nnet.effective.mmi", "{}"))
    init, low_rank = params.get("nnet.effective.init", "none"), params.get("nnet.effective.low_rank", "none")
    pruned = params.get("nnet.effective.prune", "none")
    if init != "none" and params.get("nnet.effective.epochs") == "0":  # a decoding variant
        objective += f", {init} as trained"
    elif init != "none" and params.get("nnet.effective.init_layers") == "encoder":
        objective += f", on {init}'s encoder"
    elif init != "none":
        objective += (f", SVD ({low_rank}) of {init}, fine-tuned" if low_rank != "none" else
                      f", {float(pruned):.0%} pruned from {init}, fine-tuned" if pruned != "none" else
                      f", fine-tuned from {init}")
    if params.get("nnet.effective.keep") == "last" and params.get("nnet.effective.epochs") != "0":
        objective += ", last epoch kept"
    if params.get("nnet.effective.teacher", "none") != "none":
        objective += f", taught by {params['nnet.effective.teacher']}"
    decoding = {k.removeprefix(prefix + "decode."): v for k, v in params.items() if k.startswith(prefix + "decode.")}
    if decoding:
        objective += ", decoded with " + ", ".join(f"{k} {v}" for k, v in sorted(decoding.items()))
    if params.get("nnet.effective.alignments") == CHAIN:
        objective += ", chain tree"
    sat = params.get("nnet.effective.alignments") in SAT_SOURCES
    if params.get("nnet.effective.features") == "fmllr":
        objective += ", SAT-fMLLR features" if sat else ", fMLLR features"
    elif sat:
        objective += ", SAT alignments"
    return {"model": params.get(f"{prefix}type", "?"), "objective": objective, "sizes": ", ".join(sizes),
            "parallel": _parallel(params)}


def _switched_on(param: str, key: str, label: str, symbol: str) -> str:
    """``, <label> (<symbol>=…)`` when a training run's logged setting (a dict, e.g. ``mmi`` with its
    ``weight``) has ``key`` on, else ""."""
    try:
        value = ast.literal_eval(param)
    except (ValueError, SyntaxError):
        return ""
    on = value.get(key, 0) if isinstance(value, dict) else 0
    return f", {label} ({symbol}={on:g})" if on else ""


def _mmi_label(param: str) -> str:
    """``, MMI (w=…)``, with ``, phone LM n`` for a phone-LM denominator, when MMI is on, else ""."""
    label = _switched_on(param, "weight", "MMI", "w")
    settings = ast.literal_eval(param) if label else {}  # _switched_on has parsed it: a dict
    if settings.get("denominator") == "phone_lm":
        label = f"{label[:-1]}, phone LM {settings.get('phone_lm_order', 3)})"
    return label


def _parallel(params: dict[str, str]) -> str:
    """``strategy ×learners[, compression]`` from a training run's effective parallel params."""
    prefix = "nnet.parallel.effective."
    learners = params.get(prefix + "learners")
    if learners is None or learners == "1":
        return "single"
    text = f"{params.get(prefix + 'strategy', '?')} ×{learners}"
    if params.get(prefix + "strategy") == "kavg":
        text += f" (k={params.get(prefix + 'k', '?')})"
    if params.get(prefix + "strategy") == "hierarchical":
        text += f" (groups of {params.get(prefix + 'group_size', '?')})"
    compression = params.get(prefix + "compression", "none")
    return text + (f", {compression}" if compression != "none" else "")


def system_rows(latest: dict[str, RunRecord], systems: list[str], tests: list[str]) -> list[SystemRow]:
    """Rows for ``systems`` from the newest run of each stage (``score-<system>-<test>``, ``gmm-``/``nnet-``)."""
    from asrflow.workflow import train_split

    rows = []
    score = next((r for s in systems if (r := latest.get(f"score-{s}-{tests[0]}"))), None)
    # evaluation.train_of, as the score run logged the resolved config; else the split of the same name
    main_train = (score.params.get(f"evaluation.train_of.{tests[0]}") if score else None) or train_split(tests[0])
    for system in systems:
        training = (latest.get(f"gmm-{system.removesuffix('_fmllr')}-{main_train}")
                    or latest.get(f"nnet-{system}-{main_train}"))
        row = SystemRow(system, _settings(system, training.params) if training else {})
        if training:
            row.train_seconds = training.metrics.get("seconds")
            row.parameters = training.metrics.get("parameters")
            row.model_bytes = training.metrics.get("model_bytes")
            row.frames_per_second = training.metrics.get("mean_frames_per_second")
            row.run_id = training.run_id
            row.frame_accuracy = training.metrics.get("best_valid_frame_accuracy")
            if tune := latest.get(f"tune-{system}-{main_train}"):
                row.held_out_wer = tune.metrics.get("held_out_wer")
            if training.params.get("nnet.parallel.effective.learners", "1") != "1":
                row.step_times = {k: training.metrics[f"mean_{k}"] for k in PARALLEL_TIMES
                                  if f"mean_{k}" in training.metrics}
        for test in tests:
            score = latest.get(f"score-{system}-{test}")
            if score is None:
                continue
            row.wer[test] = score.metrics["wer"]
            row.ser[test] = score.metrics["ser"]
            if "rtf" in score.metrics:
                row.rtf.append(score.metrics["rtf"])
        rows.append(row)
    return rows


def table(rows: list[SystemRow], tests: list[str]) -> tuple[list[str], list[list[str]]]:
    """Header and body of the comparison (numbers formatted; WER/SER in %)."""
    settings = ["model", "objective", "sizes"] + (["parallel"] if any(r.settings.get("parallel") for r in rows) else [])
    accuracy = any(r.frame_accuracy is not None for r in rows)
    tuned = [k for k in TUNED_COLUMNS if any(getattr(r, k) is not None for r in rows)]
    parallel = [k for k in PARALLEL_TIMES if any(k in r.step_times for r in rows)]
    loso = [t for t in tests if t.startswith("loso_")]
    header = ["system", *settings, *[f"WER {t}" for t in tests]]
    if len(loso) > 1:
        header.append("WER LOSO mean")
    sized = any(r.model_bytes is not None for r in rows)
    header += [f"SER {t}" for t in tests] + ["train s", "train frames/s", "decode RTF", "parameters"]
    header += ["model MB"] if sized else []
    header += (["held-out frame acc %"] if accuracy else []) + [TUNED_COLUMNS[k] for k in tuned] + [
        "bytes/step" if k == "bytes_per_step" else f"{k.replace('t_', 'T_')} ms" for k in parallel]
    body = []
    for r in rows:
        line = [r.system, *[r.settings.get(k, "") for k in settings]]
        line += [f"{100 * r.wer[t]:.2f}" if t in r.wer else "" for t in tests]
        if len(loso) > 1:
            values = [r.wer[t] for t in loso if t in r.wer]
            line.append(f"{100 * sum(values) / len(values):.2f}" if len(values) == len(loso) else "")
        line += [f"{100 * r.ser[t]:.2f}" if t in r.ser else "" for t in tests]
        line.append(f"{r.train_seconds:.1f}" if r.train_seconds is not None else "")
        line.append(f"{r.frames_per_second:,.0f}" if r.frames_per_second is not None else "")
        line.append(f"{sum(r.rtf) / len(r.rtf):.4f}" if r.rtf else "")
        line.append(f"{int(r.parameters):,}" if r.parameters is not None else "")
        if sized:
            line.append(f"{r.model_bytes / 1e6:.2f}" if r.model_bytes is not None else "")
        if accuracy:
            line.append(f"{100 * r.frame_accuracy:.2f}" if r.frame_accuracy is not None else "")
        line += [f"{100 * getattr(r, k):.2f}" if getattr(r, k) is not None else "" for k in tuned]
        line += [("" if k not in r.step_times else f"{r.step_times[k]:,.0f}" if k == "bytes_per_step"
                  else f"{1000 * r.step_times[k]:.2f}") for k in parallel]
        body.append(line)
    return header, body


def markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell or "–" for cell in line) + " |" for line in body]
    return "\n".join(lines) + "\n"


def html(header: list[str], body: list[list[str]], title: str) -> str:
    """A standalone HTML page with the table (embedded in the Snakemake report)."""
    from html import escape

    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in line) + "</tr>\n" for line in body)
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title><style>"
            "table{border-collapse:collapse;font:13px sans-serif}td,th{border:1px solid #bbb;padding:3px 6px}"
            f"th{{background:#eee}}</style></head><body><h3>{escape(title)}</h3><table><tr>{head}</tr>\n{rows}"
            "</table></body></html>\n")


def csv_text(header: list[str], body: list[list[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[cell.replace(",", "") if cell and cell[0].isdigit() else cell for cell in line]
                      for line in body])
    return buffer.getvalue()
