"""Resumable GMM training: where a system's iterations stand, saved after each one.

A GMM job that dies at iteration 30 of 35 (a lost node, a time limit, a full disk) goes on from
iteration 30 when it is rerun, as Kaldi's recipes go on from their last ``N.mdl`` with
``--stage``. The state lives in a folder Snakemake does not own
(``results/<exp>/gmm_state/<train>/<system>/``, as the networks' ``nnet_state``), so a failed
job does not take it with its output; it is removed once the system is written out::

    state.pkl                      the next iteration, the model, the Gaussian schedule, the random
                                   generator, failures and the system's own extras (lda: projection)
    ali.<n>.ark  ali.<n>.scp       the alignments it had then (Kaldi int32 archives), written again
                                   only when an iteration realigned

``identity`` says what the state belongs to (the system's settings, the seed and the training
shards); a state of anything else is set aside and training starts afresh.
"""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kaldiio
import numpy as np

from asrflow.gmm.model import GmmModel


@dataclass
class Progress:
    """Where a system's training stands: everything its next iteration needs."""

    iteration: int  # the next iteration to run
    model: GmmModel
    alignments: dict[str, np.ndarray]
    numgauss: int  # the Gaussian count aimed at now, and its growth per iteration
    incgauss: int
    rng: np.random.Generator
    failed: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # the system's own (lda: projection, MLLT gains)


class GmmState:
    """The saved :class:`Progress` of one system in ``folder`` (None: nothing is saved)."""

    def __init__(self, folder: str | Path | None, identity: str, log=print) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.identity = identity
        self.log = log
        self._archive: str | None = None  # the name of the alignments' archive the saved state refers to

    def load(self) -> Progress | None:
        """The saved progress, or None when there is none (or it belongs to other settings or data)."""
        if self.folder is None or not (self.folder / "state.pkl").is_file():
            return None
        with open(self.folder / "state.pkl", "rb") as f:
            saved = pickle.load(f)
        if saved["identity"] != self.identity:
            self.log(f"{self.folder}: saved state of other settings or data, starting afresh")
            return None
        alignments = {u: np.asarray(a) for u, a in kaldiio.load_scp(str(self.folder / f"{saved['ali']}.scp")).items()}
        rng = np.random.default_rng()
        rng.bit_generator.state = saved["rng"]
        progress = Progress(saved["iteration"], GmmModel.from_bytes(saved["model"]), alignments, saved["numgauss"],
                            saved["incgauss"], rng, saved["failed"], saved["extra"])
        self._archive = saved["ali"]
        self.log(f"resuming at iteration {progress.iteration} from {self.folder}")
        return progress

    def save(self, progress: Progress, realigned: bool = True) -> None:
        """Save ``progress`` atomically; its alignments only if ``realigned`` (or never saved yet)."""
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        ali = self._archive if self._archive and not realigned else f"ali.{progress.iteration}"
        if ali != self._archive:
            with kaldiio.WriteHelper(f"ark,scp:{self.folder / ali}.ark,{self.folder / ali}.scp") as writer:
                for utt in sorted(progress.alignments):
                    writer(utt, np.asarray(progress.alignments[utt], dtype=np.int32))
        state = {"identity": self.identity, "iteration": progress.iteration, "model": progress.model.to_bytes(),
                 "numgauss": progress.numgauss, "incgauss": progress.incgauss,
                 "rng": progress.rng.bit_generator.state, "failed": progress.failed, "extra": progress.extra,
                 "ali": ali}
        tmp = self.folder / "state.pkl.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
        os.replace(tmp, self.folder / "state.pkl")
        self._archive = ali
        for old in self.folder.glob("ali.*"):  # archives no state refers to any more
            if old.stem != ali:
                old.unlink()

    def finish(self) -> None:
        """Remove the state: the system is written out."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
