"""The folders one stage reads and writes, as one typed bundle (a Snakemake rule's inputs and output)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Paths:
    """Folders of one stage run for one system and split; None: the stage does not use that input.

    ``data``: the data stage's folder; ``features``: the feature kind the system reads; ``lang``: the lang of its
    training split; ``gmm``: a GMM system folder (alignments, tree, transition model); ``graph``: its HCLG (or a
    TLG) folder; ``alignments``: the align stage's folder of the speed-perturbed copies; ``init``: a trained
    network folder to start from; ``teacher``: a trained network folder to learn from; ``state``: the resumable
    training state; ``tune``: the tune stage's folder;
    ``model``: the trained system being decoded or tuned; ``heldout_lang``, ``heldout_graph``: the lang whose LM
    has not seen the held-out utterances, and its HCLG, which tuning decodes them with; ``out``: what the stage
    writes.
    """

    out: Path
    data: Path | None = None
    features: Path | None = None
    lang: Path | None = None
    gmm: Path | None = None
    graph: Path | None = None
    alignments: Path | None = None
    init: Path | None = None
    teacher: Path | None = None
    state: Path | None = None
    tune: Path | None = None
    model: Path | None = None
    heldout_lang: Path | None = None
    heldout_graph: Path | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, f.name, Path(value))

    @classmethod
    def of(cls, values: Any) -> Paths:
        """The bundle of an object's (argparse namespace's) attributes of these names; absent ones are None."""
        names = {f.name for f in fields(cls)}
        given = {n: getattr(values, n) for n in names if getattr(values, n, None) is not None}
        return cls(**given)

    def replace(self, **changes: Any) -> Paths:
        """A copy with ``changes``."""
        return replace(self, **changes)
