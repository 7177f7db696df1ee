"""One size of the scale benchmark: where its data, features and outputs are, and its JSON line."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asrflow.gmm.alignments import StoredAlignments
from asrflow.gmm.estep import AlignOptions
from asrflow.gmm.lda import gmm_features
from asrflow.gmm.shards import split_shards


def stage_line(stage: str, hours: float, wall: float, cpu: float, driver_mb: float, worker_mb: float | None,
               **extra: Any) -> dict[str, Any]:
    """One JSON line of the scale benchmark: a stage at a corpus size (the keys every stage shares)."""
    return {"stage": stage, "hours": round(hours, 2), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "wall_s_per_hour": round(wall / max(hours, 1e-9), 3), "peak_rss_driver_mb": round(driver_mb, 1),
            "peak_rss_worker_mb": None if worker_mb is None else round(worker_mb, 1), **extra}


def latest_lines(lines: list[dict]) -> tuple[list[str], dict[tuple[str, float], dict]]:
    """The stages of benchmark ``lines`` in their first order, and the latest line of each stage and size (a
    stage measured again replaces its earlier line)."""
    return list(dict.fromkeys(line["stage"] for line in lines)), {(line["stage"], line["hours"]): line
                                                                  for line in lines}


@dataclass(frozen=True)
class Size:
    """One size of the benchmark.

    ``root`` holds the size's own folders: ``corpus/`` (the sized Kaldi data dir, when made from audio),
    ``data/`` and ``features/`` (imported and extracted, or replicated), ``lang/`` and ``graph/`` (its LM and
    HCLG), ``decode/``, ``tune/``, ``score.json``. ``lang_dir`` and ``model_dir`` are the trained system's;
    ``test_root`` holds the fixed test set (``data/<test>``, ``features/<test>``) every size decodes.
    """

    config: dict[str, Any]
    root: Path
    lang_dir: Path
    model_dir: Path
    split: str
    hours: float
    test_root: Path | None = None
    test: str = "test"
    kind: str = "mfcc"
    workers: int = 2
    tune_utterances: int = 200

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def features(self) -> Path:
        return self.root / "features"

    def shards(self) -> list:
        return split_shards(self.data, self.features, self.lang_dir, self.split,
                            self.config["gmm"]["shard_utts"], **gmm_features(self.model_dir))

    def options(self) -> AlignOptions:
        cfg = self.config["gmm"]["mono"]
        return AlignOptions(beam=cfg["beam"], retry_beam=cfg["retry_beam"])

    def alignments(self) -> StoredAlignments:
        """The realign stage's alignments (where each is)."""
        with open(self.root / "refs.pkl", "rb") as f:
            return StoredAlignments(pickle.load(f))

    def stage_config(self, **sections: dict[str, Any]) -> dict[str, Any]:
        """The experiment's config with the sized corpus as a ``kaldi_dir`` corpus (no speed-perturbed split, no
        extra training corpora; the recipe's own lexicon as a file) and ``sections``' keys laid over their
        sections."""
        config = copy.deepcopy(self.config)
        if config["lang"]["lexicon"] == "corpus":  # the recipe's own lexicon, now read as a file
            config["lang"].update(lexicon="file", lexicon_file=str(_recipe_lexicon(config)))
        config["corpus"].update(name="kaldi_dir", path=str(self.root / "corpus"), extra_training=[])
        config["audio"]["speed_perturb"] = [1.0]
        for name, keys in sections.items():
            config[name].update(keys)
        return config


def _recipe_lexicon(config: dict[str, Any]) -> Path:
    """The lexicon file of the experiment's corpus recipe (``lang.lexicon: corpus``)."""
    from asrflow.corpus import recipe_from_config

    return Path(recipe_from_config(config["corpus"]).lexicon)
