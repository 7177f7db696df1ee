"""The repository speaks of the project alone: no development history, no folders outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: what must not come back in README, docs, configs, code or comments, with why
FORBIDDEN = {
    r"\b[Ii]ssues? #?\d+": "an issue number",
    r"\b[Ss]essions? #?\d+|\b(this|last|next|previous|earlier) session\b": "a work session",
    r"\b20\d\d-[01]\d-[0-3]\d\b": "a date",
    r"\.\./shared\b|\bshared/(corpora|notes)\b": "a folder outside the repository",
    r"/work/main\b|/root/": "a machine's folder",
}
#: files whose bytes are data, not text
BINARY = (".png", ".jpg", ".gif", ".pdf", ".pt", ".npy", ".gz")


def git_names() -> list[str] | None:
    """The paths git tracks (links too), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [n for n in out.decode().split("\0") if n]


def tracked_files() -> list[Path]:
    """The files git tracks (or, outside a git checkout, every file under the repository but .git and .venv)."""
    names = git_names()
    if names is None:
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()
                 and not {".git", ".venv", "results"} & set(p.relative_to(REPO).parts)]
    return [REPO / n for n in names if not n.endswith(BINARY) and (REPO / n).is_file()]


def test_no_development_history_or_outside_paths() -> None:
    me = Path(__file__).resolve()
    found = []
    for path in tracked_files():
        if path.resolve() == me:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for pattern, what in FORBIDDEN.items():
            for match in re.finditer(pattern, text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(REPO)}:{line}: {what} ({match.group(0)!r})")
    assert not found, "the repository speaks of the project alone:\n" + "\n".join(found[:50])


@pytest.mark.parametrize(("text", "caught"), [
    ("see issue 4", True), ("Issues 5 and 6", True), ("in session 12", True), ("as last session showed", True),
    ("measured on 2026-11-24", True), ("ASRFLOW_DATA_MIRROR=../shared/corpora", True),
    ("a session-scoped fixture", False), ("the issue is the OOV rate", False), ("version 2.13.0", False),
])
def test_the_patterns_catch_history_and_nothing_else(text: str, caught: bool) -> None:
    assert any(re.search(p, text) for p in FORBIDDEN) is caught


def test_the_readme_stays_short() -> None:
    """The README shows the headline results only; the rest lives in docs/ (at most 250 lines)."""
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_no_virtual_environment_is_tracked() -> None:
    """.venv (a folder or a link to one) stays out of the repository."""
    tracked = git_names() or []  # outside a git checkout nothing is tracked
    assert not [n for n in tracked if n.split("/")[0] in (".venv", ".whl", ".gpu_mirror")]
