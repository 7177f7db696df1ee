"""Ensembles: trained hybrid networks of one training split combined into one network (system combination).

An ensemble is assembled, not trained: :func:`assemble` reads its members' ``final.pt``
and writes an ``final.pt`` holding all of them as one :class:`asrflow.nnet.models.Ensemble`,
with the members' shared log priors. Tuning, decoding, scoring and the pyfunc transcriber
then take it as any hybrid network. Its folder (``results/<exp>/nnet/<train>/<system>/``)::

    final.pt        the members' weights and configs, and the log priors
    priors.npy      log pdf priors (the members', combined as their posteriors are when they differ)
    report.tsv      the members' rejected utterances (their training data)
    manifest.json   members, combine rule, parameters and training seconds summed over the members
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrflow.config.sizes import network_config
from asrflow.nnet import NnetError
from asrflow.nnet.models import build_model, parameter_count
from asrflow.nnet.prune import unpacked
from asrflow.nnet.train import atomic_save


def load_member(net_dir: Path) -> dict[str, Any]:
    """A member's ``final.pt`` (``weights_only``; a pruned member's layers unpacked), checked to be a hybrid
    network with priors."""
    path = net_dir / "final.pt"
    if not path.is_file():
        raise NnetError(f"ensemble member {net_dir}: no final.pt (train it first)")
    saved = torch.load(path, weights_only=True, map_location="cpu")
    if saved.get("objective") != "hybrid" or "priors" not in saved:
        raise NnetError(f"ensemble member {path}: a {saved.get('objective')} network; ensembles combine hybrid "
                        f"networks (tied-state posteriors and their priors)")
    return {**saved, "model": unpacked(saved["model"], saved["config"].get("pruned", []))}


def combined_checkpoint(members: list[dict[str, Any]], names: list[str], combine: str
                        ) -> tuple[dict[str, Any], torch.nn.Module]:
    """One ``final.pt`` content holding ``members`` (their ``final.pt`` contents) as an ensemble, and that model.

    The members must predict the same pdfs from the same features: equal class counts,
    input dimensions and alignment priors (equal priors mean the same alignments). Members whose
    priors are their own average posteriors (``nnet.priors: posteriors``) have their priors
    combined by the ensemble's rule (:func:`combined_priors`).
    """
    first = members[0]
    for name, saved in zip(names[1:], members[1:]):
        for key in ("num_classes", "input_dim"):
            if saved[key] != first[key]:
                raise NnetError(f"ensemble members {names[0]!r} and {name!r} differ in {key} "
                                f"({first[key]} vs {saved[key]}): they were not trained on the same alignments "
                                f"and features")
        if not torch.allclose(alignment_priors(saved), alignment_priors(first)):
            raise NnetError(f"ensemble members {names[0]!r} and {name!r} have different pdf priors: they were "
                            f"trained on different alignments")
    config = {"type": "ensemble", "members": [network_config(m["config"]) for m in members], "combine": combine}
    state = {f"members.{i}.{key}": value for i, m in enumerate(members) for key, value in m["model"].items()}
    model = build_model(config, first["input_dim"], first["num_classes"])
    model.load_state_dict(state)  # checks that every member's weights fit its config
    combined = {"model": model.state_dict(), "config": config, "num_classes": first["num_classes"],
                "input_dim": first["input_dim"], "objective": "hybrid",
                "priors": combined_priors([m["priors"] for m in members], combine), "member_names": names}
    if "alignment_priors" in first:
        combined["alignment_priors"] = first["alignment_priors"]
    return combined, model


def alignment_priors(saved: dict[str, Any]) -> torch.Tensor:
    """A hybrid's priors from its alignments (those it decodes with, unless it replaced them by its posteriors)."""
    return saved.get("alignment_priors", saved["priors"])


def combined_priors(priors: list[torch.Tensor], combine: str) -> torch.Tensor:
    """The log priors of the members' combined posteriors: the members' own when they agree; else their
    normalised geometric mean (``log_linear``) or their mean (``linear``), as the posteriors are combined."""
    if all(torch.allclose(p, priors[0]) for p in priors[1:]):
        return priors[0]
    stacked = torch.stack([p.double() for p in priors])
    if combine == "linear":
        return torch.logsumexp(stacked, dim=0) - np.log(len(priors))
    mean = stacked.mean(dim=0)
    return mean - torch.logsumexp(mean, dim=0)


def assemble(config: dict[str, Any], system: str, member_dirs: list[str | Path], out_dir: str | Path,
             log=print) -> dict[str, Any]:
    """Write ensemble ``system``'s folder (above) from its members' network folders; returns the manifest.

    ``member_dirs`` are the folders of ``nnet.models.<system>.members`` on one training split,
    in that order.
    """
    model = config["nnet"]["models"][system]
    dirs = [Path(d) for d in member_dirs]
    names = [d.name for d in dirs]
    if names != list(model["members"]):
        raise NnetError(f"ensemble {system!r} has members {', '.join(model['members'])}; "
                        f"got the folders of {', '.join(names)}")
    members = [load_member(d) for d in dirs]
    saved, network = combined_checkpoint(members, names, model["combine"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_save(saved, out / "final.pt")
    np.save(out / "priors.npy", saved["priors"].numpy())
    reports = set().union(*((d / "report.tsv").read_text().splitlines()[1:] for d in dirs))
    (out / "report.tsv").write_text("utterance\treason\n" + "".join(f"{line}\n" for line in sorted(reports)))
    manifests = [json.loads((d / "manifest.json").read_text()) for d in dirs]
    parameters = parameter_count(network)
    manifest = {"system": system, "type": "ensemble", "objective": "hybrid", "members": names,
                "combine": model["combine"], "classes": saved["num_classes"], "parameters": parameters,
                "seconds": round(sum(m["seconds"] for m in manifests), 3), "train": manifests[0]["train"]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"{system}: ensemble of {', '.join(names)} ({model['combine']}), {parameters} parameters")
    return manifest
