"""Stage runs written to a journal file by the stage, and to MLflow by one process of the workflow.

Importing MLflow and opening its SQLite store costs a stage process about 4 s of CPU, more than
most of a small corpus's jobs compute. Under Snakemake (``$ASRFLOW_TRACKING_SPOOL`` set by the
``onstart`` handler) a stage does not import MLflow: it appends its run — start, params, tags,
metrics, artifacts (copied beside the journal at once, since Snakemake deletes a failed job's
outputs), a pyfunc model to log, end — as JSON lines to ``<spool>/<run>.jsonl``. The Snakemake
process relays the journals to MLflow every few seconds (:class:`Relay`), so the runs appear
while the workflow runs, and once more when it ends; ``asrflow compare`` relays before it reads.
One process writes to the store, which also keeps a SQLite file from many jobs at once.

A relay takes ``<spool>/.lock``; ``<spool>/state.json`` keeps each journal's MLflow run id and
how far it has been relayed, so nothing is written twice. A finished journal is removed with its
artifacts once relayed. A record the store refuses is a warning and is skipped; a store that
cannot be reached leaves the journals for the next relay.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: the spool folder of the running workflow; stages journal their runs there when it is set
SPOOL_ENV = "ASRFLOW_TRACKING_SPOOL"
#: seconds between two relays of the workflow's relay thread
RELAY_EVERY = 5.0


def now_ms() -> int:
    """The time as MLflow stores it (milliseconds since the epoch)."""
    return int(time.time() * 1000)


def artifacts_of(journal: Path) -> Path:
    """The folder beside a journal that holds copies of its artifacts."""
    return journal.with_suffix(".artifacts")


class Journal:
    """The journal of one stage run: JSON lines appended to ``<spool>/<name>.jsonl``, artifacts beside it."""

    def __init__(self, spool: str | Path, stage: str) -> None:
        self.spool = Path(spool)
        name = f"{time.strftime('%Y%m%dT%H%M%S')}-{stage}-{uuid.uuid4().hex[:8]}"
        self.path = self.spool / f"{name}.jsonl"
        self.artifacts = artifacts_of(self.path)
        self.spool.mkdir(parents=True, exist_ok=True)
        self._copies = 0
        self._lock = threading.Lock()  # a training's metrics come from a thread of their own

    def record(self, op: str, **fields: Any) -> None:
        """Append one record (``op`` and its fields); a line is complete when its newline is written."""
        line = json.dumps({"op": op, **fields}) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)

    def copy(self, path: str | Path) -> Path:
        """A copy of ``path`` (a file or a folder) beside the journal, for an artifact relayed later."""
        self._copies += 1
        target = self.artifacts / str(self._copies) / Path(path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(path).is_dir():
            shutil.copytree(path, target)
        else:
            shutil.copy2(path, target)
        return target


@contextmanager
def _locked(spool: Path) -> Iterator[None]:
    spool.mkdir(parents=True, exist_ok=True)
    with open(spool / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _complete_lines(path: Path, offset: int) -> list[tuple[dict[str, Any], int]]:
    """The records of ``path`` after byte ``offset`` whose lines are complete, each with the offset after it."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    records = []
    for line in data[: data.rfind(b"\n") + 1].splitlines(keepends=True):
        offset += len(line)
        if line.strip():
            records.append((json.loads(line), offset))
    return records


def relay(config: Mapping[str, Any], spool: str | Path, ended: str | None = None) -> dict[str, int]:
    """Write what the journals in ``spool`` hold and MLflow does not yet; returns counts of the runs opened,
    records written, runs ended and failed relays (0 or 1).

    ``ended``: the parent run id of a workflow that has ended; a run of it whose journal has no end record
    (its job was killed) ends FAILED, as does one of an earlier workflow whose parent run is over. Never
    raises: a failure is a warning, and what was not written stays for the next relay.
    """
    from asrflow.tracking.mlflow_runs import warn

    spool = Path(spool)
    counts = {"runs": 0, "records": 0, "ended": 0, "failed": 0}
    if not spool.is_dir():
        return counts
    try:
        with _locked(spool):
            state_path = spool / "state.json"
            state = json.loads(state_path.read_text()) if state_path.is_file() else {}
            state = {name: entry for name, entry in state.items() if (spool / name).is_file()}
            try:
                for path in sorted(spool.glob("*.jsonl")):
                    _relay_journal(config, path, state.setdefault(path.name, {"offset": 0}), ended, counts)
                    if state[path.name].get("ended"):
                        path.unlink()
                        shutil.rmtree(artifacts_of(path), ignore_errors=True)
                        del state[path.name]
                        counts["ended"] += 1
            finally:
                tmp = state_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(state))
                os.replace(tmp, state_path)
    except Exception as exc:  # tracking must never stop the workflow
        warn("relaying the stages' runs", exc)
        counts["failed"] = 1
    return counts


def _relay_journal(config: Mapping[str, Any], path: Path, entry: dict[str, Any], ended: str | None,
                   counts: dict[str, int]) -> None:
    """Relay one journal from ``entry["offset"]``, updating ``entry`` after every record it writes."""
    from asrflow.tracking.mlflow_runs import LiveRecorder, open_run, warn

    records = _complete_lines(path, entry["offset"])
    if not records and not ended:
        return
    recorder = LiveRecorder.of(config, entry["run_id"]) if entry.get("run_id") else None
    for record, offset in records:
        op = record.pop("op")
        if op == "start":
            recorder = open_run(config, **record)
            entry["run_id"], entry["parent"] = recorder.run_id, record["tags"].get("mlflow.parentRunId")
            counts["runs"] += 1
        elif recorder is None:
            raise RuntimeError(f"{path.name}: a {op} record before the run's start")
        else:
            try:
                recorder.apply(op, record)
            except Exception as exc:  # a value the store refuses: that record is skipped
                if not _refused(exc):
                    raise
                warn(f"{path.name}: {op}", exc)
            entry["ended"] = op == "end"
        counts["records"] += 1
        entry["offset"] = offset
    if ended and recorder is not None and not entry.get("ended") and _workflow_over(recorder, entry, ended):
        recorder.apply("end", {"status": "FAILED", "time": now_ms()})
        entry["ended"] = True


def _workflow_over(recorder: Any, entry: Mapping[str, Any], ended: str) -> bool:
    """Whether the workflow of a journal's run has ended: the one that ``ended``, or an earlier one that was
    stopped before it could say so (its parent run no longer RUNNING, or never opened)."""
    parent = entry.get("parent")
    if parent == ended or not parent:
        return True
    try:
        return recorder.client.get_run(parent).info.status != "RUNNING"
    except Exception:  # no such parent run in this store
        return True


def _refused(exc: Exception) -> bool:
    """Whether ``exc`` is MLflow refusing a value (as opposed to a store it cannot reach)."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and getattr(exc, "error_code", "") == "INVALID_PARAMETER_VALUE"


class Relay:
    """A daemon thread of the workflow's process that relays the journals every :data:`RELAY_EVERY` seconds
    (after a failed relay, twice as long each time, up to a minute); :meth:`stop` relays once more, ending the
    runs of the workflow ``parent`` that never ended, and waits for it."""

    def __init__(self, config: Mapping[str, Any], spool: str | Path, parent: str,
                 every: float = RELAY_EVERY) -> None:
        self.config, self.spool, self.parent, self.every = config, Path(spool), parent, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="asrflow-tracking-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wait = self.every
        while not self._stop.wait(wait):
            failed = relay(self.config, self.spool)["failed"]
            wait = min(2 * wait, 60.0) if failed else self.every

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        counts = relay(self.config, self.spool, ended=self.parent)
        if not counts["failed"] and not any(self.spool.glob("*.jsonl")):
            shutil.rmtree(self.spool, ignore_errors=True)  # every run is in MLflow
        if counts["runs"] or counts["ended"]:
            print(f"asrflow: relayed {counts['ended']} stage runs to MLflow", file=sys.stderr)
        return counts
