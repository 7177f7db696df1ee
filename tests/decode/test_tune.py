"""Decoder tuning on held-out utterances: the grid, the choice among ties, the word insertion penalty."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asrflow.data.holdout import held_out_speakers
from asrflow.decode.tune import (
    AXES,
    at_edge,
    choose,
    grid_points,
    neighbourhood_mean,
    spread,
    tuned_settings,
    visit,
    walk_line,
)
from asrflow.kaldi import add_word_penalty, fst_arcs, kfst


def test_grid_is_row_major_over_the_axes() -> None:
    tune = {"acoustic_scale": [0.1, 0.2], "insertion_penalty": [0.0, 1.0, 2.0], "lm_weight": [9],
            "tlg_acoustic_scale": [1.0], "tlg_insertion_penalty": [-1.0, 0.5]}
    points = grid_points(tune, AXES["hclg"])
    assert points[:4] == [{"acoustic_scale": 0.1, "insertion_penalty": 0.0},
                          {"acoustic_scale": 0.1, "insertion_penalty": 1.0},
                          {"acoustic_scale": 0.1, "insertion_penalty": 2.0},
                          {"acoustic_scale": 0.2, "insertion_penalty": 0.0}]
    assert len(points) == 6
    # a TLG network takes its acoustic scales and penalties from their own lists
    assert grid_points(tune, AXES["tlg"]) == [{"acoustic_scale": 1.0, "insertion_penalty": -1.0},
                                              {"acoustic_scale": 1.0, "insertion_penalty": 0.5}]


def test_the_fewest_errors_win() -> None:
    errors = [5, 4, 3,
              2, 1, 6,
              7, 8, 9]
    assert choose(errors, (3, 3)) == 4


def test_a_tie_goes_to_the_better_neighbourhood() -> None:
    # (0, 0) and (2, 2) both make 1 error; (2, 2) sits among 2s, (0, 0) among 9s
    errors = [1, 9, 9,
              9, 9, 2,
              9, 2, 1]
    assert choose(errors, (3, 3)) == 8


def test_a_flat_optimum_is_left_at_its_middle() -> None:
    errors = [0] * 5 + [3]
    assert neighbourhood_mean(np.array(errors, dtype=float).reshape(6, 1))[1, 0] == 0
    assert choose(errors, (6, 1)) == 1  # 0..3 tie on errors and neighbourhood; 1 and 2 are nearest the middle
    assert choose([2, 2, 2], (3,)) == 1
    assert choose([4], (1, 1)) == 0


def test_unvisited_points_are_left_out_of_the_choice() -> None:
    nan = float("nan")
    errors = [nan, 3, nan,
              2, 2, 5,
              nan, 9, nan]
    assert choose(errors, (3, 3)) == 3  # (1, 0) and (1, 1) tie; (1, 0)'s visited neighbours do better


def _bowl(point: tuple[int, ...]) -> int:
    """Errors with one minimum at (4, 2), and an axis interaction that a single sweep would miss."""
    a, b = point
    return (a - 4) ** 2 + 2 * (b - 2) ** 2 + (a - 4) * (b - 2) + 3


def test_coordinate_search_finds_the_grid_optimum_with_fewer_decodes() -> None:
    batches: list[list[tuple[int, ...]]] = []

    def evaluate(points):
        batches.append(points)
        return [_bowl(p) for p in points]

    grid = visit((7, 5), "grid", evaluate)
    assert len(grid) == 35 and len(batches) == 1
    batches.clear()
    line = visit((7, 5), "coordinate", evaluate)
    assert batches[0] == [(i, 0) for i in range(7)]  # the first setting's list, the others at their first value
    assert len(line) < len(grid) and all(line[p] == grid[p] for p in line)
    shape = (7, 5)
    chosen = choose([line.get(p, float("nan")) for p in np.ndindex(shape)], shape)
    assert np.unravel_index(chosen, shape) == (4, 2)
    assert sum(len(b) for b in batches) == len(line)  # no point decoded twice


def test_a_tuning_cap_spreads_over_the_held_out_utterances() -> None:
    utts = {f"u{i:03d}" for i in range(100)}
    assert spread(utts, None) == utts and spread(utts, 500) == utts
    capped = spread(utts, 10)
    assert len(capped) == 10 and min(capped) == "u000" and max(capped) == "u090"


def test_held_out_speakers_keep_all_their_utterances() -> None:
    utt2spk = {f"s{s}_{u}": f"s{s}" for s in range(10) for u in range(5 + s)}
    utts = sorted(utt2spk)
    chosen = held_out_speakers(utts, utt2spk, 0.1, seed=0)
    speakers = {utt2spk[u] for u in chosen}
    assert chosen == {u for u in utts if utt2spk[u] in speakers}  # whole speakers
    assert len(chosen) >= 0.1 * len(utts) and len(speakers) < 10
    assert held_out_speakers(utts, utt2spk, 0.1, seed=0) == chosen  # seeded
    assert held_out_speakers(["a", "b"], {"a": "x", "b": "x"}, 0.4, 0) == {"a", "b"}  # one speaker: held out


def test_the_word_penalty_costs_every_output_word_and_nothing_else() -> None:
    fst = kfst.compile("0 1 3 7 0.5\n1 2 4 0 0.25\n2 3 5 8\n3 1.5\n")
    arcs = fst_arcs(add_word_penalty(fst, 2.0))
    assert arcs == [(0, 3, 7, 2.5, 1), (1, 4, 0, 0.25, 2), (2, 5, 8, 2.0, 3)]
    assert fst_arcs(add_word_penalty(fst, 0.0)) == fst_arcs(fst)


def test_decoder_graphs_are_penalised_and_cached(tmp_path: Path) -> None:
    from asrflow.decode.decoder import _graph

    kfst.compile("0 1 3 1 0.5\n1 0.0\n").write(str(tmp_path / "HCLG.fst"))
    (tmp_path / "words.txt").write_text("<eps> 0\nyes 1\n")
    path = str(tmp_path / "HCLG.fst")
    plain, words = _graph(path)
    penalised, _ = _graph(path, 1.0)
    assert words == ["<eps>", "yes"]
    assert plain.type == penalised.type == "const"  # searched as Kaldi's HCLG.fst is, from a vector file
    assert fst_arcs(plain)[0][3] == 0.5 and fst_arcs(penalised)[0][3] == 1.5
    assert _graph(path, 1.0)[0] is penalised and _graph(path)[0] is plain
    other, _ = _graph(path, -1.0)  # a walk's step each way: both penalised copies stay
    assert fst_arcs(other)[0][3] == -0.5
    assert _graph(path, 1.0)[0] is penalised and _graph(path, -1.0)[0] is other
    third, _ = _graph(path, 2.0)  # a third: the least recently used (1.0) goes
    assert fst_arcs(third)[0][3] == 2.5 and _graph(path, -1.0)[0] is other
    assert _graph(path, 1.0)[0] is not penalised


def test_no_tune_folder_means_the_configured_settings(tmp_path: Path) -> None:
    assert tuned_settings(None) == {}
    (tmp_path / "tune.json").write_text('{"chosen": {"acoustic_scale": 0.05, "insertion_penalty": 1.0}}')
    assert tuned_settings(tmp_path) == {"acoustic_scale": 0.05, "insertion_penalty": 1.0}


def test_the_tuning_lm_has_not_seen_the_held_out_transcripts(tmp_path: Path) -> None:
    """held_out_lang: the lang's symbol tables and lexicon, an LM estimated without the held-out sentences, whose
    words only they say are out of its vocabulary (as a test set's unseen words are out of the lang's), listed
    for the tune stages that read the lang instead of making it."""
    from asrflow.decode.tune import held_out_lang, lm_vocabulary
    from asrflow.lang.stage import prepare_lang

    from ..conftest import make_config

    texts = {"a": "yes no yes", "b": "no no", "c": "yes yes no", "d": "no no yes yes maybe"}
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "text").write_text("".join(f"{u} {t}\n" for u, t in texts.items()))
    config = make_config(tmp_path, lang={"lexicon": "grapheme", "lm_order": 3})
    prepare_lang(config, tmp_path / "data", "train", [], tmp_path / "lang", log=lambda *_: None)
    (tmp_path / "lang" / ".snakemake_timestamp").write_text("")  # Snakemake's own marker stays behind
    tune_lang, vocabulary = held_out_lang(config, tmp_path / "lang", tmp_path / "data", "train", {"d"},
                                          tmp_path / "tune")
    assert vocabulary == {"yes", "no"} == lm_vocabulary(tune_lang)
    assert not (tune_lang / ".snakemake_timestamp").exists()
    for name in ("words.txt", "phones.txt", "L_disambig.fst", "lexicon.txt", "silence.int"):
        assert (tune_lang / name).read_bytes() == (tmp_path / "lang" / name).read_bytes()
    full, tuning = ((d / "lm.arpa").read_text() for d in (tmp_path / "lang", tune_lang))
    assert "no no yes" in full and "no no yes" not in tuning  # a trigram only the held-out sentence has
    assert "maybe" in full and "maybe" not in tuning  # a word only it has
    assert "yes yes no" in tuning and (tune_lang / "G.fst").stat().st_size > 0


def test_held_out_speakers_come_from_every_group() -> None:
    """hold_out: groups draws whole speakers from each group of speakers (here gender × age), each group
    giving about the fraction of its utterances; a group of one speaker gives none."""
    from asrflow.data.holdout import held_out_by_group

    groups = {f"s{s:02d}": (("f", "m")[s % 2], ("child", "adult")[s // 20]) for s in range(40)}
    groups["lonely"] = ("x", "adult")
    utt2spk = {f"{s}_{u}": s for s in groups for u in range(4)}
    utts = sorted(utt2spk)
    chosen = held_out_by_group(utts, utt2spk, groups, 0.1, seed=0)
    speakers = {utt2spk[u] for u in chosen}
    assert chosen == {u for u in utts if utt2spk[u] in speakers}  # whole speakers
    assert {groups[s] for s in speakers} == {(g, a) for g in "fm" for a in ("child", "adult")}  # all four groups
    assert "lonely" not in speakers and len(speakers) == 4  # 10 speakers per group: one each
    assert held_out_by_group(utts, utt2spk, groups, 0.1, seed=0) == chosen  # seeded


def test_held_out_groups_are_read_from_the_training_data_dir(tmp_path: Path) -> None:
    from asrflow.data.holdout import held_out_utterances
    from tests.conftest import make_config

    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    speakers = [f"s{s}" for s in range(8)]
    (train / "utt2spk").write_text("".join(f"{s}_{u} {s}\n" for s in speakers for u in range(3)))
    (train / "text").write_text("".join(f"{s}_{u} yes no\n" for s in speakers for u in range(3)))
    (train / "spk2gender").write_text("".join(f"{s} {'fm'[i % 2]}\n" for i, s in enumerate(speakers)))
    config = make_config(tmp_path, nnet={"hold_out": "groups", "valid_fraction": 0.2},
                         evaluation={"groups": {"gender": {}}})
    chosen = held_out_utterances(config, tmp_path / "data", "train")
    genders = {"fm"[int(u[1]) % 2] for u in chosen}
    assert genders == {"f", "m"} and len(chosen) == 6  # one speaker of each gender, all 3 utterances
    from asrflow.config import ConfigError

    with pytest.raises(ConfigError, match="evaluation.groups, which is empty"):
        make_config(tmp_path, nnet={"hold_out": "groups"})


def test_an_optimum_at_the_end_of_a_list_is_flagged_only_when_it_beats_its_neighbour() -> None:
    # acoustic scale (rows) x penalty (columns); the best scale is the smallest listed
    errors = [10, 12, 14,
              11, 13, 15,
              12, 14, 16]
    assert at_edge(errors, (3, 3), choose(errors, (3, 3)), ["scale", "penalty"]) == {"scale": "smallest",
                                                                                     "penalty": "smallest"}
    assert at_edge([5, 3, 4], (3,), 1, ["scale"]) == {}  # inside the list
    assert at_edge([4, 4, 5], (3,), 0, ["scale"]) == {}  # a tie with the neighbour: flat, not beyond
    assert at_edge([6, 5, 3], (3,), 2, ["scale"]) == {"scale": "largest"}
    assert at_edge([3, float("nan")], (2,), 0, ["scale"]) == {}  # the neighbour was not visited
    assert at_edge([3], (1,), 0, ["scale"]) == {}  # a single value is no range


def test_the_word_penalty_keeps_a_branching_graph_s_paths_and_their_costs() -> None:
    # two paths from 0 to 3, a loop, output-epsilon arcs, and states whose arcs are not sorted by word
    # (as an HCLG's are not); words 1..3
    unsorted = [3, 0, 1, 0, 2, 3, 1, 0, 2, 1, 0, 3]
    fst = kfst.compile("".join(f"0 {1 + k % 2} {10 + k} {w} {0.1 * k}\n" for k, w in enumerate(unsorted))
                       + "1 1 6 0 0.1\n1 3 5 3 0.0\n1 3 8 1 0.4\n2 3 7 0 0.2\n3 0.25\n")
    penalised = add_word_penalty(fst, 1.5)

    def states(f: object) -> list[tuple]:
        """Each state's arcs (ilabel, olabel, weight) and final weight, in any order: equal for equal graphs
        whose states are numbered otherwise."""
        arcs: dict[int, list] = {}
        for s, i, o, w, _ in fst_arcs(f):
            arcs.setdefault(s, []).append((i, o, round(w, 6)))
        return sorted((tuple(sorted(arcs.get(s, []))), round(f.final(s).value, 6)) for s in range(f.num_states))

    expected = [(tuple(sorted((i, o, round(w + 1.5, 6) if o else w) for i, o, w in arcs)), final)
                for arcs, final in states(fst)]
    assert penalised.num_states == fst.num_states and penalised.start == fst.start
    assert states(penalised) == sorted(expected)
    assert states(add_word_penalty(fst, 1.5, words=3)) == states(penalised)


def test_a_walk_finds_the_bowl_s_optimum_with_fewer_decodes_than_the_coordinate_search() -> None:
    decoded: list[tuple[int, ...]] = []

    def evaluate(points):
        decoded.extend(points)
        return [_bowl(p) for p in points]

    line = visit((7, 5), "coordinate", evaluate)
    decoded.clear()
    walk = visit((7, 5), "walk", evaluate)
    shape = (7, 5)
    assert np.unravel_index(choose([walk.get(p, float("nan")) for p in np.ndindex(shape)], shape), shape) == (4, 2)
    assert len(walk) < len(line) and len(decoded) == len(set(decoded)) == len(walk)


def test_a_walk_stops_at_the_first_point_worse_than_the_best_of_its_line() -> None:
    curve = [669, 634, 662, 735, 781, 844]  # a held-out error curve over the acoustic scales
    decoded: list[int] = []

    def evaluate(points):
        decoded.extend(i for i, in points)
        return [curve[i] for i, in points]

    errors: dict[tuple[int, ...], int] = {}
    walk_line([(i,) for i in range(6)], 0, errors, evaluate)
    assert decoded == [0, 1, 2]
    decoded.clear()
    walk_line([(i,) for i in range(6)], 4, {}, evaluate)  # from the middle: both ways, down to the minimum
    assert sorted(decoded) == [0, 1, 2, 3, 4, 5]
    decoded.clear()
    walk_line([(i,) for i in range(6)], 1, {}, evaluate)
    assert sorted(decoded) == [0, 1, 2]


def test_tuning_runs_each_held_out_shard_through_the_network_once(tmp_path, monkeypatch) -> None:
    """Scoring with ``keep`` (what tuning asks for) gives a shard's log posteriors again without running the
    network; another network file, a new modification time or ``keep`` off runs it; the memory cap holds."""
    import os

    import torch

    from asrflow.decode import decoder
    from asrflow.gmm import estep
    from asrflow.nnet.inference import Scoring
    from asrflow.nnet.models import build_model

    torch.manual_seed(0)
    config = {"type": "dnn", "hidden": 8, "layers": 1, "context": 1, "dropout": 0.0}
    for name in ("a.pt", "b.pt"):
        torch.save({"model": build_model(config, 5, 3).state_dict(), "config": config, "input_dim": 5,
                    "num_classes": 3}, tmp_path / name)
    rng = np.random.default_rng(0)
    mats = {utt: rng.standard_normal((n, 5)).astype(np.float32) for utt, n in (("u1", 30), ("u2", 12))}
    read: list[str] = []

    def features(shard):
        read.append(shard.key)
        return [mats[u] for u in shard.utts]

    monkeypatch.setattr(estep, "features", features)
    monkeypatch.setattr(decoder, "_KEPT", {})
    shard = estep.Shard("s0", ("u1", "u2"), ("x", "x"), estep.Shard.pack(("f:1", "f:2"), ((), ()), {}), str(tmp_path),
                        deltas=0)
    other = estep.Shard("s1", ("u2",), ("x",), estep.Shard.pack(("f:2",), ((),), {}), str(tmp_path), deltas=0)
    kept = Scoring(str(tmp_path / "a.pt"), keep=True)
    frames, first = kept.shard_log_posteriors(shard)
    assert frames == [30, 12] and [p.shape for p in first] == [(30, 3), (12, 3)]
    assert kept.shard_log_posteriors(shard)[1] is first and read == ["s0"]  # kept: not read, not run again
    assert np.allclose(Scoring(str(tmp_path / "a.pt")).shard_log_posteriors(shard)[1][0], first[0])
    assert read == ["s0", "s0"]  # keep off: run again
    kept.shard_log_posteriors(other)
    Scoring(str(tmp_path / "b.pt"), keep=True).shard_log_posteriors(shard)  # another network: a's are let go
    assert read == ["s0", "s0", "s1", "s0"] and len(decoder._KEPT) == 1
    stat = os.stat(tmp_path / "b.pt")
    os.utime(tmp_path / "b.pt", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the network written again
    Scoring(str(tmp_path / "b.pt"), keep=True).shard_log_posteriors(shard)
    assert read[-1] == "s0" and len(read) == 5
    monkeypatch.setattr(decoder, "KEEP_BYTES", 100)  # too little for any shard: each is run every time
    monkeypatch.setattr(decoder, "_KEPT", {})
    kept.shard_log_posteriors(shard)
    kept.shard_log_posteriors(shard)
    assert read[-2:] == ["s0", "s0"] and not decoder._KEPT


def test_gmm_tuning_computes_each_shard_s_log_likelihoods_once(monkeypatch) -> None:
    """A GMM decode with ``keep`` (tuning's) computes the pdf log-likelihoods of a shard on its first call only;
    a changed model computes them again, and a test decode (no ``keep``) never keeps them."""
    from asrflow.decode import decoder
    from asrflow.gmm import estep

    computed: list[bytes] = []

    class Model:
        tid2pdf = np.zeros(3, dtype=np.int64)

        def __init__(self, blob: bytes) -> None:
            self.blob = blob

        def pdf_loglikes(self, x: np.ndarray) -> np.ndarray:
            computed.append(self.blob)
            return np.zeros((x.shape[0], 2), dtype=np.float32)

    monkeypatch.setattr(decoder, "_KEPT", {})
    monkeypatch.setattr(decoder.GmmModel, "from_bytes", staticmethod(Model))
    monkeypatch.setattr(decoder, "features", lambda shard: [np.zeros((7, 4), np.float32)] * len(shard.utts))
    monkeypatch.setattr(decoder, "decode_settings", lambda utts, frames, scores, *rest: (frames, scores))
    payload = estep.Shard.pack(("f:1", "f:2"), ((), ()), {})
    shard = estep.Shard("s0", ("u1", "u2"), ("x", "x"), payload, "lang", deltas=0)
    frames, first = decoder.decode_shard_settings(shard, b"model-1", "HCLG.fst", [], keep=True)
    assert frames == [7, 7] and len(computed) == 2
    assert decoder.decode_shard_settings(shard, b"model-1", "HCLG.fst", [], keep=True)[1] is first
    assert len(computed) == 2
    decoder.decode_shard_settings(shard, b"model-2", "HCLG.fst", [], keep=True)
    assert computed[2:] == [b"model-2", b"model-2"]
    decoder.decode_shard_settings(shard, b"model-2", "HCLG.fst", [])
    decoder.decode_shard_settings(shard, b"model-2", "HCLG.fst", [])
    assert len(computed) == 8 and len(decoder._KEPT) == 1
