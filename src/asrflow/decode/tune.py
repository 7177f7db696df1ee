"""Decoder settings tuned per network on its held-out utterances.

Kaldi's ``score.sh`` sweeps the LM weight and the word insertion penalty and reports the
best WER on the test set itself. Here the sweep runs on the utterances each network held
out of training (``nnet.valid_fraction`` of the training split, used so far only for early
stopping), and the test sets are decoded once, with the winner:

- hybrid networks: ``acoustic_scale`` × ``insertion_penalty`` through the HCLG;
- CTC networks over phones: ``acoustic_scale`` × ``insertion_penalty`` through TLG (their own lists,
  ``tlg_acoustic_scale`` and ``tlg_insertion_penalty``);
- other CTC networks: ``lm_weight`` × ``word_bonus`` in the prefix beam search.

One forward pass per shard serves the whole grid (``search: grid``), or each line of a
coordinate search (``search: coordinate``: one setting's list at a time, the others fixed at
their best so far, until nothing changes; about the sum of the lists' lengths in decodes
instead of their product), or each step of a walk (``search: walk``: the coordinate search's
rounds, each list walked from the current value while the errors fall; a few decodes per list).
The workers keep the held-out shards' scores (a network's log posteriors, a GMM's log-likelihoods)
from one step to the next, so the acoustic model runs once per shard whatever the search (up to a
memory cap per worker).
Held-out sets are small, so several settings often tie on errors;
the tie goes to the setting whose (visited) grid neighbours make the fewest errors, and then to
the middle of what is still tied (a flat optimum's centre rather than its edge).

The held-out transcripts belong to the training split, so the lang folder's LM has seen
them; on sentence prompts (Asterisk) it then favours an LM weight far stronger than the
test sets, whose sentences it has not seen, want. Tuning therefore decodes with an LM
estimated without them, over the other transcripts' words (so words only the held-out
utterances say are out of its vocabulary, as the test sets' unseen words are out of the
lang's), and its own HCLG or TLG. Every system of a training split tunes on the same held-out
utterances, so the workflow builds that lang once per split (rule ``lang_heldout``,
:func:`heldout_lang`) and its HCLG once per GMM tree (rule ``graph_heldout``), and the tune
stages read them; a tune stage given neither builds its own.

"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.config.paths import Paths
from asrflow.data.datadir import own_texts, read_table
from asrflow.lang.lexicon import oov_rate
from asrflow.score.wer import score_corpus

#: The file of a held-out lang that lists its LM's words (the tuning OOV rate is over them).
VOCABULARY = "lm_words.txt"

#: Per decoder kind (:func:`asrflow.config.settings.decoder_kind`): each tuned setting and the
#: ``nnet.decode.tune`` list of values it takes.
AXES = {"hclg": {"acoustic_scale": "acoustic_scale", "insertion_penalty": "insertion_penalty"},
        "tlg": {"acoustic_scale": "tlg_acoustic_scale", "insertion_penalty": "tlg_insertion_penalty"},
        "prefix": {"lm_weight": "lm_weight", "word_bonus": "word_bonus"}}


def grid_points(tune: dict[str, Any], axes: dict[str, str]) -> list[dict[str, float]]:
    """Every combination of the listed values of ``axes`` (setting -> list in ``tune``), first axis slowest."""
    return [dict(zip(axes, values)) for values in itertools.product(*(tune[key] for key in axes.values()))]


def neighbourhood_mean(errors: np.ndarray) -> np.ndarray:
    """Mean of each grid point's errors and its neighbours' (±1 along every axis, clipped at the edges; points
    not visited, NaN, left out)."""
    out = np.full(errors.shape, np.nan)
    for index in np.ndindex(errors.shape):
        window = errors[tuple(slice(max(0, i - 1), i + 2) for i in index)]
        if not np.isnan(window).all():
            out[index] = np.nanmean(window)
    return out


def choose(errors: list[float], shape: tuple[int, ...]) -> int:
    """Row-major index of the chosen grid point (NaN: not visited).

    Fewest errors; among those, the best neighbourhood mean; among those, the one nearest
    (in grid steps) to their centroid; then the first.
    """
    grid = np.asarray(errors, dtype=float).reshape(shape)
    smooth = neighbourhood_mean(grid).ravel()
    flat = grid.ravel()
    tied = np.flatnonzero(flat == np.nanmin(flat))
    tied = tied[smooth[tied] == smooth[tied].min()]
    coords = np.array(np.unravel_index(tied, shape)).T
    distance = np.abs(coords - coords.mean(axis=0)).sum(axis=1)
    return int(tied[np.lexsort((tied, distance))[0]])


def at_edge(errors: list[float], shape: tuple[int, ...], best: int, axes: list[str]) -> dict[str, str]:
    """The axes along which ``best`` (row-major index) lies at the end of its list with fewer errors than its
    visited neighbour inward: the optimum may lie beyond the list (``{axis: "smallest" | "largest"}``)."""
    grid = np.asarray(errors, dtype=float).reshape(shape)
    index = np.unravel_index(best, shape)
    edges = {}
    for axis, name in enumerate(axes):
        size, i = shape[axis], int(index[axis])
        if size < 2 or i not in (0, size - 1):
            continue
        inward = list(index)
        inward[axis] = 1 if i == 0 else size - 2
        if not np.isnan(grid[tuple(inward)]) and grid[tuple(index)] < grid[tuple(inward)]:
            edges[name] = "smallest" if i == 0 else "largest"
    return edges


def visit(shape: tuple[int, ...], search: str,
          evaluate: Callable[[list[tuple[int, ...]]], list[int]], max_rounds: int = 4) -> dict[tuple[int, ...], int]:
    """Errors at the grid points a search visits; ``evaluate(points)`` decodes a batch of points (grid indices).

    ``grid``: every point, in one batch. ``coordinate``: from index 0 of every axis, a line along one axis at a
    time (one batch of the points not yet visited) moves to its chosen point (:func:`choose`), until a round
    over every axis moves nowhere (at most ``max_rounds`` rounds). ``walk``: the same rounds, but each line is
    walked from the current point (:func:`walk_line`) instead of decoded whole.
    """
    if search == "grid":
        points = list(np.ndindex(shape))
        return dict(zip(points, evaluate(points)))
    errors: dict[tuple[int, ...], int] = {}
    current = (0,) * len(shape)
    for _ in range(max_rounds):
        moved = False
        for axis in range(len(shape)):
            line = [current[:axis] + (i,) + current[axis + 1:] for i in range(shape[axis])]
            if search == "walk":
                walk_line(line, current[axis], errors, evaluate)
            elif new := [p for p in line if p not in errors]:
                errors.update(zip(new, evaluate(new)))
            chosen = line[choose([errors.get(p, np.nan) for p in line], (len(line),))]
            moved |= chosen != current
            current = chosen
        if not moved:
            break
    return errors


def walk_line(line: list[tuple[int, ...]], start: int, errors: dict[tuple[int, ...], int],
              evaluate: Callable[[list[tuple[int, ...]]], list[int]]) -> None:
    """Walk ``line`` (grid points in list order) outwards from index ``start``, one step in each open direction
    per batch, adding what is decoded to ``errors``; a direction closes at its end or at a point with more
    errors than the best of the line so far (a line search: for the unimodal curves of an LM weight or a
    penalty, the lists' optimum for a few decodes instead of the whole list)."""
    if line[start] not in errors:
        errors.update(zip([line[start]], evaluate([line[start]])))
    low = high = start
    down, up = start > 0, start < len(line) - 1
    while down or up:
        steps = ([low - 1] if down else []) + ([high + 1] if up else [])
        if new := [line[i] for i in steps if line[i] not in errors]:
            errors.update(zip(new, evaluate(new)))
        low, high = min(low, *steps), max(high, *steps)
        best = min(errors[line[i]] for i in range(low, high + 1))
        down = down and low > 0 and errors[line[low]] <= best
        up = up and high < len(line) - 1 and errors[line[high]] <= best


def spread(utterances: set[str], limit: int | None) -> set[str]:
    """At most ``limit`` of ``utterances``, evenly spread over them in sorted order (None: all)."""
    if limit is None or len(utterances) <= limit:
        return set(utterances)
    ordered = sorted(utterances)
    return {ordered[int(i * len(ordered) / limit)] for i in range(limit)}


def hypotheses(results: list[list[Any]], setting: int) -> dict[str, str]:
    """Words of every utterance decoded with setting number ``setting`` (results: per shard, per setting)."""
    return {utt: " ".join(words) for per_shard in results for utt, words in per_shard[setting].hyps.items()}


def tune_network(config: dict[str, Any], system: str, train_split: str, paths: Paths, client: Any,
                 log=print) -> dict[str, Any]:
    """Decode network ``system``'s held-out utterances over the tuning grid; write ``tune.json`` and ``grid.tsv``
    into ``paths.out`` (the network in ``paths.model``; a hybrid's HCLG is built from the GMM in ``paths.gmm``).

    ``tune.json`` holds ``chosen`` (the settings the test sets are decoded with), its held-out
    errors and WER, and the whole grid. The held-out utterances are decoded with an LM estimated
    without their transcripts (:func:`held_out_lang`; its HCLG or TLG built here, in ``graph/``).
    """
    from asrflow.config import model_cmvn, settings
    from asrflow.decode.stage import decode_network, make_graph
    from asrflow.nnet import NnetError

    out, net_dir, gmm_dir = paths.out, paths.model, paths.gmm
    tune = settings.decoding(config, system).tune.as_dict()  # with the network's own lists
    kind = settings.decoder_kind(config["nnet"]["models"][system])
    if kind == "hclg" and gmm_dir is None:
        raise NnetError(f"hybrid network {system!r} needs --gmm to tune (its HCLG is built from that GMM)")

    graph = paths.graph if kind == "prefix" else paths.heldout_graph or out / "graph"

    def build_graph(lang: Path) -> None:
        if kind != "prefix" and paths.heldout_graph is None:
            make_graph(lang, gmm_dir if kind == "hclg" else None, graph, log=log)

    def decode(lang: Path, shards: list, points: list[dict[str, float]], desc: str) -> list[list[Any]]:
        return decode_network(config, system, net_dir, lang, shards, client, points, gmm_dir, graph, desc=desc,
                              keep=True)[1]

    return tune_decoder(config, system, config["nnet"]["models"][system]["objective"], AXES[kind], tune,
                        paths.data, paths.features, paths.lang, train_split, out, build_graph, decode,
                        {"deltas": 0, "cmvn": model_cmvn(config, system)}, heldout=paths.heldout_lang, log=log)


def tune_gmm(config: dict[str, Any], system: str, model_dir: str | Path, data_dir: str | Path,
             feats_dir: str | Path, lang_dir: str | Path, train_split: str, out_dir: str | Path, client: Any,
             adapted: bool = False, heldout: tuple[Path, Path] | None = None, log=print) -> dict[str, Any]:
    """The GMM counterpart of :func:`tune_network` (``decode.tune``): acoustic scale × insertion penalty of GMM
    ``system`` (the model in ``model_dir``; ``<gmm>_fmllr``, ``adapted``, on its adapted features) chosen on the
    networks' held-out utterances, decoded with the held-out LM through its HCLG: ``heldout``, the folders of
    both (rules ``lang_heldout`` and ``graph_heldout``), or else both built here.

    With ``gmm.hold_out`` (the default) the GMM was not trained on those utterances either; without it, its
    acoustic scores there are more confident than on new speech, and tuning picks too small a scale.
    """
    from asrflow.decode.stage import decode_gmm, make_graph
    from asrflow.gmm.lda import gmm_features

    out = Path(out_dir)
    heldout_lang, graph = heldout if heldout is not None else (None, out / "graph")

    def build_graph(lang: Path) -> None:
        if heldout is None:
            make_graph(lang, model_dir, graph, log=log)

    def decode(lang: Path, shards: list, points: list[dict[str, float]], desc: str) -> list[list[Any]]:
        return decode_gmm(config, model_dir, graph, shards, client, points, desc=desc, keep=True)[1]

    return tune_decoder(config, system, "gmm", AXES["hclg"], config["decode"]["tune"], data_dir, feats_dir,
                        lang_dir, train_split, out, build_graph, decode, gmm_features(model_dir, adapted),
                        heldout=heldout_lang, log=log)


def tune_decoder(config: dict[str, Any], system: str, objective: str, axes: dict[str, str], tune: dict[str, Any],
                 data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path, train_split: str, out: Path,
                 build_graph: Callable[[Path], Any],
                 decode: Callable[[Path, list, list[dict[str, float]], str], list[list[Any]]],
                 features: dict[str, Any], heldout: Path | None = None, log=print) -> dict[str, Any]:
    """The grid search shared by networks and GMMs.

    ``axes`` maps each tuned setting to its list in ``tune``; ``build_graph(lang)`` makes the graph
    of the held-out LM's lang (``heldout``, made by :func:`heldout_lang`; None: made here, in
    ``out/lang``), and ``decode(lang, shards, points, desc)`` decodes ``shards`` once per grid
    point through it (per shard, one result per point). ``features``: how the system reads its
    features (keyword arguments of :func:`~asrflow.gmm.shards.split_shards`).
    """
    from asrflow.data.holdout import held_out_utterances
    from asrflow.gmm.shards import split_shards
    from asrflow.nnet import NnetError

    out.mkdir(parents=True, exist_ok=True)
    points = grid_points(tune, axes)
    shape = tuple(len(tune[key]) for key in axes.values())
    held_out = held_out_utterances(config, data_dir, train_split)
    shards = split_shards(data_dir, feats_dir, lang_dir, train_split, config["nnet"]["decode"]["shard_utts"],
                          only=spread(held_out, tune["max_utterances"]), **features)
    if not shards:
        raise NnetError(f"no held-out utterances of {train_split} with features to tune {system} on")
    # the LM and graph without the held-out transcripts (the test sets' are not in the LM either)
    if heldout is None:
        lang_dir, vocabulary = held_out_lang(config, lang_dir, data_dir, train_split, held_out, out / "lang")
    else:
        lang_dir, vocabulary = Path(heldout), lm_vocabulary(heldout)
    build_graph(lang_dir)
    texts = read_table(Path(data_dir) / train_split / "text")
    refs = {utt: texts[utt] for s in shards for utt in s.utts}
    scored: dict[int, dict[str, Any]] = {}

    def evaluate(indices: list[tuple[int, ...]]) -> list[int]:
        flat = [int(np.ravel_multi_index(i, shape)) for i in indices]
        results = decode(lang_dir, shards, [points[j] for j in flat], f"tune-{system}-{len(scored)}")
        for k, j in enumerate(flat):
            summary, _ = score_corpus(refs, hypotheses(results, k))
            scored[j] = {**points[j], "errors": summary["errors"], "wer": summary["wer"]}
        return [scored[j]["errors"] for j in flat]

    visit(shape, tune["search"], evaluate)
    grid = [scored[j] for j in sorted(scored)]
    errors = [scored[j]["errors"] if j in scored else np.nan for j in range(len(points))]
    best = choose(errors, shape)
    edges = at_edge(errors, shape, best, list(axes))
    info = {"system": system, "objective": objective, "train": train_split, "utterances": len(refs),
            "words": sum(len(t.split()) for t in refs.values()), "oov_rate": oov_rate(refs.values(), vocabulary)[0],
            "axes": list(axes), "search": tune["search"],
            "chosen": points[best], "errors": scored[best]["errors"], "wer": scored[best]["wer"],
            "at_edge": edges, "grid": grid}
    (out / "tune.json").write_text(json.dumps(info, indent=2) + "\n")
    (out / "grid.tsv").write_text("\t".join([*axes, "errors", "wer"]) + "\n" + "".join(
        "\t".join(str(g[k]) for k in (*axes, "errors", "wer")) + "\n" for g in grid))
    log(f"{system}: {len(grid)} of {len(points)} decoder settings ({tune['search']} search) on "
        f"{info['utterances']} held-out utterances "
        f"({info['words']} words, {100 * info['oov_rate']:.1f} % out of the tuning LM's vocabulary): "
        f"errors from {min(g['errors'] for g in grid)} to {max(g['errors'] for g in grid)}; "
        f"chosen {', '.join(f'{k} {v}' for k, v in points[best].items())} ({info['errors']} errors)")
    section = "decode.tune" if objective == "gmm" else "nnet.decode.tune"
    for name, end in edges.items():
        log(f"warning: {system}'s chosen {name} {points[best][name]} is the {end} of its list and beats its "
            f"neighbour: the best setting may lie beyond it; widen {section}.{axes[name]}")
    return info


def held_out_lang(config: dict[str, Any], lang_dir: str | Path, data_dir: str | Path, train_split: str,
                  held_out: set[str], out_dir: Path) -> tuple[Path, set[str]]:
    """A copy of ``lang_dir`` whose LM (``lm.arpa``, ``G.fst``) is estimated without the transcripts of the
    ``held_out`` utterances, so tuning does not decode sentences the LM has seen; and the LM's vocabulary.

    The vocabulary is that of the other transcripts: words only the held-out utterances say
    are out of it, as the test sets' unseen words are out of the lang's (the lexicon and
    symbol tables stay the lang's, so the graph matches the acoustic model's phones).
    """
    import shutil

    from asrflow.lang.graph import compile_grammar
    from asrflow.lang.stage import write_lm

    lang, out = Path(lang_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in lang.iterdir():
        if path.is_file() and path.name not in ("lm.arpa", "G.fst", "manifest.json") and not path.name.startswith("."):
            shutil.copyfile(path, out / path.name)
    texts = [t for u, t in own_texts(Path(data_dir) / train_split).items() if u not in held_out]
    vocabulary = write_lm(config, texts, out)[0].words
    compile_grammar(out / "lm.arpa", out / "words.txt").write(str(out / "G.fst"))
    (out / VOCABULARY).write_text("".join(f"{w}\n" for w in sorted(vocabulary)), encoding="utf-8")
    return out, vocabulary


def heldout_lang(config: dict[str, Any], lang_dir: str | Path, data_dir: str | Path, train_split: str,
                 out_dir: str | Path) -> tuple[Path, set[str]]:
    """The lang every system of ``train_split`` tunes with (rule ``lang_heldout``): :func:`held_out_lang` of the
    utterances the networks hold out (:func:`~asrflow.data.holdout.held_out_utterances`)."""
    from asrflow.data.holdout import held_out_utterances

    held_out = held_out_utterances(config, data_dir, train_split)
    return held_out_lang(config, lang_dir, data_dir, train_split, held_out, Path(out_dir))


def lm_vocabulary(lang_dir: str | Path) -> set[str]:
    """The words of a held-out lang's LM, as :func:`held_out_lang` listed them."""
    return set(Path(lang_dir, VOCABULARY).read_text(encoding="utf-8").split())


def tuned_settings(tune_dir: str | Path | None) -> dict[str, float]:
    """The settings chosen by :func:`tune_network` (none when ``tune_dir`` is None)."""
    if tune_dir is None:
        return {}
    return json.loads((Path(tune_dir) / "tune.json").read_text())["chosen"]
