"""Resumable GMM training: where a system's iterations stand, saved after each one.

A GMM job that dies at iteration 30 of 35 (a lost node, a time limit, a full disk) goes on from
iteration 30 when it is rerun, as Kaldi's recipes go on from their last ``N.mdl`` with
``--stage``. The state lives in a folder Snakemake does not own
(``results/<exp>/gmm_state/<train>/<system>/``, as the networks' ``nnet_state``), so a failed
job does not take it with its output; it is removed once the system is written out::

    state.pkl        the next iteration, the model, the Gaussian schedule, the random generator,
                     failures, the system's own extras (lda: projection) and where each
                     utterance's current alignment is
    ali.<n>/         the alignments iteration n wrote (one Kaldi int32 archive per shard, written
                     by the workers); removed once no saved alignment is in them

``identity`` says what the state belongs to (the system's settings, the seed and the training
shards); a state of anything else is set aside and training starts afresh. Without a folder the
state lives in a temporary folder of this machine (local workers only) until :meth:`GmmState.finish`
or the end of the process.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.gmm.alignments import Alignment
from asrflow.gmm.model import GmmModel

#: Bumped when state.pkl's contents change: an older state is not resumed.
FORMAT = 2


@dataclass
class Progress:
    """Where a system's training stands: everything its next iteration needs."""

    iteration: int  # the next iteration to run
    model: GmmModel
    alignments: dict[str, Alignment]  # where each utterance's current alignment is (archive references)
    numgauss: int  # the Gaussian count aimed at now, and its growth per iteration
    incgauss: int
    rng: np.random.Generator
    failed: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # the system's own (lda: projection, MLLT gains)


class GmmState:
    """The saved :class:`Progress` of one system in ``folder`` (None: a temporary folder, nothing resumable)."""

    def __init__(self, folder: str | Path | None, identity: str, log=print) -> None:
        self.temporary = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="asrflow-gmm-")) if folder is None else Path(folder)
        if self.temporary:  # removed by finish(), or when the process ends at the latest
            atexit.register(shutil.rmtree, self.folder, True)
        self.identity = identity
        self.log = log

    def archives(self, name: str) -> Path:
        """The folder ``name`` of the state folder, where a pass's workers write their alignment archives."""
        folder = self.folder / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def load(self) -> Progress | None:
        """The saved progress, or None when there is none (or it belongs to other settings, data or format)."""
        if self.temporary or not (self.folder / "state.pkl").is_file():
            return None
        with open(self.folder / "state.pkl", "rb") as f:
            saved = pickle.load(f)
        if saved.get("format") != FORMAT or saved["identity"] != self.identity:
            self.log(f"{self.folder}: saved state of other settings, data or format, starting afresh")
            return None
        rng = np.random.default_rng()
        rng.bit_generator.state = saved["rng"]
        progress = Progress(saved["iteration"], GmmModel.from_bytes(saved["model"]), saved["alignments"],
                            saved["numgauss"], saved["incgauss"], rng, saved["failed"], saved["extra"])
        self.log(f"resuming at iteration {progress.iteration} from {self.folder}")
        return progress

    def save(self, progress: Progress) -> None:
        """Save ``progress`` atomically, then remove the archive folders none of its alignments is in."""
        self.folder.mkdir(parents=True, exist_ok=True)
        state = {"format": FORMAT, "identity": self.identity, "iteration": progress.iteration,
                 "model": progress.model.to_bytes(), "numgauss": progress.numgauss, "incgauss": progress.incgauss,
                 "rng": progress.rng.bit_generator.state, "failed": progress.failed, "extra": progress.extra,
                 "alignments": progress.alignments}
        tmp = self.folder / "state.pkl.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
        os.replace(tmp, self.folder / "state.pkl")
        used = {Path(ref.rpartition(":")[0]).parent.name for ref in progress.alignments.values()
                if isinstance(ref, str)}
        for old in self.folder.glob("ali.*"):
            if old.is_dir() and old.name not in used:
                shutil.rmtree(old, ignore_errors=True)

    def finish(self) -> None:
        """Remove the state: the system is written out."""
        shutil.rmtree(self.folder, ignore_errors=True)
