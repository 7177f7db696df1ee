"""Kaldi tables read and joined a line at a time, as Kaldi's sorted tables allow.

Kaldi keeps every ``key value`` table of a data dir sorted by key (``utils/validate_data_dir.sh``
checks it), so tables that share keys are joined by walking them side by side, and several sorted
streams are merged the same way (``sort -m``): a stage holds one line of each, not the tables. A
table out of order (written by hand) raises :class:`Unsorted`, and the reader then falls back to
reading it whole.
"""

from __future__ import annotations

import heapq
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO


class Unsorted(Exception):
    """A table whose keys are not in sorted order (Kaldi's data dirs are sorted; asrflow's always are)."""


def entries(path: str | Path) -> Iterator[tuple[str, str]]:
    """The ``(key, value)`` lines of a Kaldi table in file order, read a line at a time (the value is the rest
    of the line, so paths with spaces survive)."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            key, _, value = line.rstrip("\n").partition(" ")
            if key:
                yield key, value


def sorted_rows(path: str | Path) -> Iterator[tuple[str, str]]:
    """:func:`entries` of a table whose keys must increase; :class:`Unsorted` when one does not."""
    last = ""
    for key, value in entries(path):
        if key <= last:
            raise Unsorted(f"{path}: key {key} after {last}")
        last = key
        yield key, value


def lookup(rows: Iterator[tuple[str, str]]) -> Callable[[str], str | None]:
    """A lookup of increasing keys in sorted ``rows`` (a merge join): the value of a key, or None."""
    current: list = [next(rows, None)]

    def value(key: str) -> str | None:
        while current[0] is not None and current[0][0] < key:
            current[0] = next(rows, None)
        return current[0][1] if current[0] is not None and current[0][0] == key else None

    return value


def optional_lookup(path: Path) -> tuple[Callable[[str], str | None], Iterator[tuple[str, str]]]:
    """:func:`lookup` over the table at ``path`` (nothing when it does not exist) and its rows (to read to the
    end afterwards, so that a table out of order anywhere is found)."""
    rows = sorted_rows(path) if path.is_file() else iter(())
    return lookup(rows), rows


def drain(*rows: Iterator) -> None:
    """Read the rest of each of ``rows`` (:class:`Unsorted` if one is out of order past the last key used)."""
    for stream in rows:
        for _ in stream:
            pass


def ordered_rows(path: str | Path) -> Iterator[tuple[str, str]]:
    """The rows of a Kaldi table in key order: read a line at a time when the file is sorted (checked in a first
    pass), else read whole and sorted."""
    try:
        drain(sorted_rows(path))
    except Unsorted:
        return iter(sorted(entries(path)))
    return sorted_rows(path)


class ExternalSort:
    """Lines sorted by key in bounded memory, as Kaldi's ``sort`` does: ``buffer`` lines are kept and sorted,
    each full buffer is written to a sorted run file in ``folder``, and :meth:`merged` merges the runs as it
    reads them. Lines with equal keys keep the order they were added in. Keys have no whitespace."""

    def __init__(self, folder: str | Path, buffer: int = 20_000) -> None:
        self.folder, self.buffer = Path(folder), buffer
        self.lines: list[tuple[str, str]] = []
        self.runs: list[Path] = []

    def add(self, key: str, line: str) -> None:
        """Add ``line`` (no newline in it) under ``key``."""
        self.lines.append((key, line))
        if len(self.lines) >= self.buffer:
            self._spill()

    def _spill(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        run = self.folder / f"run.{id(self):x}.{len(self.runs):05d}"
        with open(run, "w", encoding="utf-8", newline="\n") as out:
            out.writelines(f"{key} {line}\n" for key, line in sorted(self.lines, key=_first))
        self.runs.append(run)
        self.lines = []

    def merged(self) -> Iterator[tuple[str, str]]:
        """Every ``(key, line)`` in key order (once: the runs are removed when read to the end)."""
        if not self.runs:
            yield from sorted(self.lines, key=_first)
            self.lines = []
            return
        if self.lines:
            self._spill()
        try:
            yield from heapq.merge(*(_run_lines(run) for run in self.runs), key=_first)
        finally:
            for run in self.runs:
                run.unlink(missing_ok=True)
            self.runs = []


    def discard(self) -> None:
        """Forget every line and remove the runs (and their folder, when empty)."""
        for run in self.runs:
            run.unlink(missing_ok=True)
        self.lines, self.runs = [], []
        if self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()


def _first(item: tuple[str, str]) -> str:
    return item[0]


def _run_lines(path: Path) -> Iterator[tuple[str, str]]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            key, _, rest = line.rstrip("\n").partition(" ")
            yield key, rest


@contextmanager
def atomic_text(path: str | Path) -> Iterator[TextIO]:
    """A text file to write, under a temporary name renamed to ``path`` when the block ends without an error
    (removed when it raises), so a reader never sees half of it."""
    with _atomic(path, "w", encoding="utf-8", newline="\n") as out:
        yield out


@contextmanager
def atomic_binary(path: str | Path) -> Iterator[BinaryIO]:
    """:func:`atomic_text`'s binary file."""
    with _atomic(path, "wb") as out:
        yield out


@contextmanager
def _atomic(path: str | Path, mode: str, **options: str) -> Iterator[TextIO | BinaryIO]:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, mode, **options) as out:
            yield out
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
