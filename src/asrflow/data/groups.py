"""Groups of speakers by an attribute the data dir records (``spk2<attribute>``, ``evaluation.groups``):
WER per group in scoring, and held-out speakers drawn from every group."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from asrflow.data.datadir import DataDirError, read_table


def speaker_groups(split_dir: Path, groups: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Attribute → speaker → group of ``evaluation.groups``, from the data dir's ``spk2<attribute>``: each value
    its own group, or with ``edges`` the label of the range a number falls in (below the first edge: the first
    label). A missing table or a value that is not a number where one is needed is a DataDirError."""
    out: dict[str, dict[str, str]] = {}
    for attribute, spec in groups.items():
        table = read_table(split_dir / f"spk2{attribute}")
        edges = spec.get("edges")
        if not edges:
            out[attribute] = dict(table)
            continue
        labels = spec.get("labels") or [f"{lo}-{hi}" for lo, hi in zip(["min", *edges], [*edges, "max"])]
        if len(labels) != len(edges) + 1:
            raise DataDirError(f"evaluation.groups.{attribute}: {len(edges)} edges need {len(edges) + 1} labels, "
                               f"not {len(labels)}")
        try:
            out[attribute] = {s: labels[bisect.bisect_right(edges, float(v))] for s, v in table.items()}
        except ValueError:
            raise DataDirError(f"{split_dir / f'spk2{attribute}'}: evaluation.groups.{attribute} has edges, but "
                               f"a value is not a number") from None
    return out


def group_of_speaker(split_dir: Path, groups: dict[str, dict[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Speaker → its groups, one per attribute of ``groups`` in order ("" where the speaker lacks one)."""
    by_attribute = speaker_groups(split_dir, groups)
    speakers = set().union(*by_attribute.values())
    return {s: tuple(by_attribute[a].get(s, "") for a in groups) for s in speakers}
