"""GMM training on Dask: the same model with 1 or 2 workers, and when a worker dies mid E-step; aligning
the speed-perturbed copies of the training split with the trained model; speaker-adapted (fMLLR) features."""

from __future__ import annotations

import copy
import itertools
import os
import random
import signal
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import soundfile as sf

from asrflow.cluster import dask_client
from asrflow.config.paths import Paths
from asrflow.data.datadir import read_table
from asrflow.data.holdout import held_out_utterances
from asrflow.data.stage import prepare_data
from asrflow.decode.stage import make_graph
from asrflow.features.ark import load, read_scp
from asrflow.features.stage import extract_features
from asrflow.gmm import fmllr
from asrflow.gmm.adapt import adapt_splits, read_transforms
from asrflow.gmm.alignments import read_alignments
from asrflow.gmm.estep import features
from asrflow.gmm.lda import gmm_features
from asrflow.gmm.resume import GmmState
from asrflow.gmm.shards import split_shards, subset_utterances
from asrflow.gmm.stage import align_split, save_alignments, train_system
from asrflow.gmm.train import train_lda, train_mono, train_tri
from asrflow.lang.stage import prepare_lang

from ..conftest import make_config, write_wav

# one pytest-xdist worker runs the whole module: its module fixtures are computed once
pytestmark = pytest.mark.xdist_group("gmm_training")

QUIET = lambda *_: None  # noqa: E731
SMALL = {"mono": {"iterations": 6, "realign_iterations": [1, 2, 4], "gaussians": 120, "max_iter_inc": 4}}


@pytest.fixture(scope="module")
def yesno(tmp_path_factory, mirror, dask_client_1):
    tmp = tmp_path_factory.mktemp("gmm")
    os.environ["ASRFLOW_DATA_MIRROR"] = str(mirror)
    config = make_config(tmp, corpus={"name": "yesno"}, features={"kinds": ["mfcc"]}, gmm=SMALL,
                         audio={"sample_rate": 8000, "speed_perturb": [0.9, 1.0, 1.1]})
    prepare_data(config, tmp / "data", dask_client_1, log=QUIET)
    extract_features(config, tmp / "data", "mfcc", tmp / "mfcc", dask_client_1, log=QUIET)
    prepare_lang(config, tmp / "data", "train", ["test"], tmp / "lang", log=QUIET)
    shards = split_shards(tmp / "data", tmp / "mfcc", tmp / "lang", "train", 4)
    return config, shards, tmp / "lang"


def _train(config, shards, lang, client):
    steps: list[tuple[int, dict]] = []
    result = train_mono(config, shards, lang, client, lambda i, m: steps.append((i, m)), QUIET)
    return result, steps


def _two_workers():
    cfg = {"cluster": "local", "address": None, "workers": 2, "host": "127.0.0.1", "dashboard": False}
    return dask_client(cfg, log=QUIET)


def test_mono_trains_and_logs_each_iteration(yesno, dask_client_1) -> None:
    config, shards, lang = yesno
    result, steps = _train(config, shards, lang, dask_client_1)
    assert [i for i, _ in steps] == list(range(6))
    likes = [m["loglike_per_frame"] for _, m in steps]
    assert likes[-1] > likes[1]  # training improves the likelihood
    assert steps[-1][1]["gaussians"] > steps[0][1]["gaussians"] == result.model.am.num_pdfs
    assert len(result.alignments) == 31 and not result.failed


def _subset_reference(frames: dict[str, int], utt2spk: dict[str, str], count: int, by: str) -> set[str]:
    """The subset by its definition, from whole tables (``utils/subset_data_dir.sh``)."""
    if by == "shortest":
        return set(sorted(frames, key=lambda u: (frames[u], u))[:count])
    by_speaker: dict[str, list[str]] = {}
    for utt in sorted(frames):
        by_speaker.setdefault(utt2spk[utt], []).append(utt)
    turns = itertools.zip_longest(*(by_speaker[s] for s in sorted(by_speaker)))
    return set([u for turn in turns for u in turn if u is not None][:count])


def test_subsets_take_the_shortest_or_each_speaker_in_turn() -> None:
    frames = {"a1": 50, "a2": 10, "a3": 30, "b1": 40, "b2": 20, "c1": 60}
    utt2spk = {u: u[0] for u in frames}

    def rows(table: dict[str, int] = frames) -> Iterator[tuple[str, int, str]]:
        return ((u, table[u], utt2spk[u]) for u in sorted(table))

    assert subset_utterances(rows, 3, "shortest") == {"a2", "b2", "a3"}
    assert subset_utterances(rows, 4, "speakers") == {"a1", "b1", "c1", "a2"}
    assert subset_utterances(rows, 10, "speakers") == set(frames)
    rng = random.Random(3)
    for _ in range(50):  # the streamed subset is the one of the definition
        table = {f"s{rng.randrange(8)}-{i:03d}": rng.randrange(1, 9) for i in range(rng.randrange(1, 60))}
        utt2spk.update({u: u.split("-")[0] for u in table})
        for count in (1, 5, 17, len(table)):
            for by in ("shortest", "speakers"):
                assert subset_utterances(lambda t=table: rows(t), count, by) == _subset_reference(
                    table, utt2spk, count, by)


class _Run:
    """What train_system logs to (the tracking run)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.steps.append(step)


def test_shards_are_read_from_sorted_tables_a_line_at_a_time_and_from_unsorted_ones_too(yesno, tmp_path) -> None:
    """split_shards merges the sorted tables as it reads them; a table out of order (written by hand) gives the
    same shards from dicts. The driver keeps only ids and speakers; the rest travels packed."""
    import pickle
    import shutil

    config, shards, lang = yesno
    root = lang.parent
    for kind in ("data", "mfcc"):
        shutil.copytree(root / kind / "train", tmp_path / kind / "train")
    scp = tmp_path / "mfcc" / "train" / "feats.scp"
    scp.write_text("".join(reversed(scp.read_text().splitlines(keepends=True))))
    again = split_shards(tmp_path / "data", tmp_path / "mfcc", lang, "train", 4)
    assert [(s.utts, s.speakers, s.feats, s.word_ids) for s in again] == \
        [(s.utts, s.speakers, s.feats, s.word_ids) for s in shards]
    assert all(a.cmvn.keys() == b.cmvn.keys() for a, b in zip(again, shards))
    assert len({s.key for s in shards}) == len(shards)
    assert shards[0].speakers[0] is shards[-1].speakers[-1]  # one string per speaker
    assert pickle.loads(pickle.dumps(shards[0])).word_ids == shards[0].word_ids  # as a task receives it
    only = split_shards(root / "data", root / "mfcc", lang, "train", 4, only={shards[1].utts[0], shards[2].utts[1]})
    assert [s.utts for s in only] == [(shards[1].utts[0], shards[2].utts[1])]


def test_a_monophone_on_a_subset_aligns_every_utterance(yesno, dask_client_1, tmp_path) -> None:
    """gmm.mono.subset: the monophone trains on the shortest utterances and aligns the whole split after, so
    the next system has every alignment."""
    config, shards, lang = yesno
    root = lang.parent
    subset = make_config(root, corpus={"name": "yesno"}, features={"kinds": ["mfcc"]},
                         audio={"sample_rate": 8000}, gmm={"mono": {**SMALL["mono"], "subset": 10}})
    run = _Run()
    manifest = train_system(subset, "mono", "train", root / "data", root / "mfcc", lang, tmp_path / "mono",
                            dask_client_1, run, log=QUIET)
    assert (manifest["trained_on"], manifest["utterances"], manifest["aligned"]) == (10, 31, 31)
    assert len(read_alignments(tmp_path / "mono" / "ali")) == 31
    assert run.steps == list(range(6))


def test_gmms_train_without_the_networks_held_out_utterances_and_align_them_after(yesno, dask_client_1,
                                                                                  tmp_path) -> None:
    """gmm.hold_out: the utterances the networks hold out (decoder tuning decodes them) are left out of GMM
    training and aligned with the trained model, so the networks still have their validation alignments."""
    config, shards, lang = yesno
    root = lang.parent
    counts = {}
    for hold_out in (True, False):
        cfg = make_config(root, corpus={"name": "yesno"}, features={"kinds": ["mfcc"]}, audio={"sample_rate": 8000},
                          gmm={"hold_out": hold_out, "mono": SMALL["mono"]}, nnet={"valid_fraction": 0.2})
        manifest = train_system(cfg, "mono", "train", root / "data", root / "mfcc", lang,
                                tmp_path / f"mono{hold_out}", dask_client_1, _Run(), log=QUIET)
        counts[hold_out] = (manifest["trained_on"], manifest["held_out"], manifest["aligned"])
        assert set(read_alignments(tmp_path / f"mono{hold_out}" / "ali")) >= (
            held_out_utterances(cfg, root / "data", "train"))
    held = len(held_out_utterances(cfg, root / "data", "train"))
    assert held == round(0.2 * 31)
    assert counts == {True: (31 - held, held, 31), False: (31, 0, 31)}
    # the triphones too: tri on Δ+ΔΔ, lda through its own projection
    small = {"iterations": 4, "realign_iterations": [2], "leaves": 30, "gaussians": 150, "min_leaf_count": 20}
    cfg = make_config(root, corpus={"name": "yesno"}, features={"kinds": ["mfcc"]}, audio={"sample_rate": 8000},
                      gmm={"tri": small, "lda": {**small, "mllt_iterations": [2]}}, nnet={"valid_fraction": 0.2})
    source = tmp_path / "monoTrue"
    for system in ("tri", "lda"):
        manifest = train_system(cfg, system, "train", root / "data", root / "mfcc", lang, tmp_path / system,
                                dask_client_1, _Run(), source_dir=source, log=QUIET)
        assert (manifest["trained_on"], manifest["held_out"], manifest["aligned"]) == (31 - held, held, 31)
        source = tmp_path / system


def test_same_model_with_two_workers_and_a_killed_worker(yesno, dask_client_1) -> None:
    config, shards, lang = yesno
    reference, _ = _train(config, shards, lang, dask_client_1)
    with _two_workers() as client:
        pids = client.run(os.getpid)
        out: dict = {}

        def run() -> None:
            try:
                out["result"] = _train(config, shards, lang, client)[0]
            except BaseException as exc:  # surfaced below
                out["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        killed = None
        deadline = time.monotonic() + 120
        # Kill the first worker seen running a realigning E-step after the flat start.
        while killed is None and thread.is_alive() and time.monotonic() < deadline:
            busy = [w for w, keys in client.processing().items()
                    if any(str(k).startswith(("iter1-", "iter2-", "iter4-")) for k in keys)]
            if busy:
                killed = busy[0]
                os.kill(pids[killed], signal.SIGKILL)
            time.sleep(0.001)
        thread.join(timeout=300)
        assert killed is not None, "no E-step was seen running"
    assert "error" not in out, repr(out.get("error"))
    result = out["result"]
    assert result.model.to_bytes() == reference.model.to_bytes()
    assert result.alignments.keys() == reference.alignments.keys()
    assert all((result.alignments[u] == reference.alignments[u]).all() for u in reference.alignments)


class _Stopped(Exception):
    """The job dying after an iteration."""


def test_a_gmm_job_that_dies_goes_on_from_its_last_iteration(yesno, dask_client_1, tmp_path) -> None:
    """The state saved after every iteration: a rerun after a failure at iteration 3 starts at iteration 4 and
    ends with the model and alignments of an uninterrupted run; a state of other settings is not resumed."""
    config, shards, lang = yesno
    reference, _ = _train(config, shards, lang, dask_client_1)

    def stop_after_3(step: int, metrics: dict) -> None:
        if step == 3:
            raise _Stopped

    with pytest.raises(_Stopped):
        train_mono(config, shards, lang, dask_client_1, stop_after_3, QUIET, GmmState(tmp_path, "mono-a", QUIET))
    steps: list[int] = []
    result = train_mono(config, shards, lang, dask_client_1, lambda i, m: steps.append(i), QUIET,
                        GmmState(tmp_path, "mono-a", QUIET))
    assert steps == [4, 5]
    assert result.model.to_bytes() == reference.model.to_bytes()
    assert all((result.alignments[u] == reference.alignments[u]).all() for u in reference.alignments)
    # only the last realignment's archives (the workers' own, one per shard) are kept
    assert [p.name for p in tmp_path.glob("ali.*")] == ["ali.4"]
    assert len(list((tmp_path / "ali.4").glob("*.ark"))) == len(shards)
    steps.clear()
    train_mono(config, shards, lang, dask_client_1, lambda i, m: steps.append(i), QUIET,
               GmmState(tmp_path, "mono-b", QUIET))
    assert steps == list(range(6))  # other settings: from the start


def _speech_start(phones: list[str]) -> int:
    """The first frame of a non-silence phone."""
    return next(i for i, p in enumerate(phones) if not p.startswith("SIL"))


def test_speed_perturbed_copies_align_where_their_audio_moved(yesno, dask_client_1, tmp_path) -> None:
    config, shards, lang = yesno
    root = lang.parent
    result, _ = _train(config, shards, lang, dask_client_1)
    result.model.save(tmp_path / "mono")
    manifest = align_split(config, "mono", tmp_path / "mono", "train_sp", root / "data", root / "mfcc", lang,
                           tmp_path / "align", dask_client_1, log=QUIET)
    assert (manifest["utterances"], manifest["aligned"], manifest["failed"]) == (93, 93, 0)
    ali = read_alignments(tmp_path / "align" / "ali")
    frames = {u: int(n) for u, n in read_table(root / "mfcc" / "train_sp" / "utt2num_frames").items()}
    assert all(len(ali[u]) == frames[u] for u in frames)
    id2phone = {i: p for p, i in read_table(lang / "phones.txt").items()}
    phones = {u: [id2phone[str(i)] for i in ids]
              for u, ids in read_alignments(tmp_path / "align" / "ali", "phones").items()}
    for factor in (0.9, 1.1):
        # the audio plays `factor` times as fast: a copy is 1/factor as long, and its speech starts 1/factor as late
        ratios = [frames[f"sp{factor}-{u}"] / frames[u] for u in result.alignments]
        assert np.median(ratios) == pytest.approx(1 / factor, abs=0.01)
        moved = [abs(_speech_start(phones[f"sp{factor}-{u}"]) - _speech_start(phones[u]) / factor)
                 for u in result.alignments]
        assert np.median(moved) <= 2


def test_fmllr_features_of_training_copies_and_test_speakers(yesno, dask_client_1, tmp_path) -> None:
    """Each speaker of train (from its alignments), train_sp (each copy speaker on its own) and test (from
    two decoding passes) gets a transform that raises the likelihood, and the written features are
    the GMM's features through it."""
    config, shards, lang = yesno
    root = lang.parent
    result, _ = _train(config, shards, lang, dask_client_1)
    result.model.save(tmp_path / "mono")
    save_alignments(tmp_path / "mono" / "ali", result.model, result.alignments)
    make_graph(lang, tmp_path / "mono", tmp_path / "graph", log=QUIET)
    align_split(config, "mono", tmp_path / "mono", "train_sp", root / "data", root / "mfcc", lang,
                tmp_path / "align", dask_client_1, log=QUIET)
    out = tmp_path / "fmllr"
    paths = Paths(out=out, data=root / "data", features=root / "mfcc", lang=lang, gmm=tmp_path / "mono",
                  graph=tmp_path / "graph", alignments=tmp_path / "align")
    manifest = adapt_splits(config, "mono", "train", paths, dask_client_1, log=QUIET)
    splits = manifest["splits"]
    assert list(splits) == ["train", "train_sp", "test"]
    assert [splits[s]["utterances"] for s in splits] == [31, 93, 29]
    assert [splits[s]["adapted"] for s in splits] == [1, 3, 1]  # yesno has one speaker; train_sp adds two copies
    assert splits["test"]["supervised"] is False and len(splits["test"]["gain_per_frame_by_pass"]) == 2
    assert all(g > 0 for s in splits.values() for g in s["gain_per_frame_by_pass"][:1])
    for split in splits:
        scp = read_scp(out / split / "feats.scp")
        assert set(scp) == set(read_table(root / "mfcc" / split / "utt2num_frames"))
    trans = {line.split()[0]: np.asarray(line.split()[1:], dtype=float).reshape(39, 40)
             for line in (out / "test" / "trans.txt").read_text().splitlines()}
    test = split_shards(root / "data", root / "mfcc", lang, "test", 50)[0]
    written = read_scp(out / "test" / "feats.scp")
    for utt, spk, x in list(zip(test.utts, test.speakers, features(test)))[:3]:
        np.testing.assert_allclose(load(written[utt]), fmllr.apply(trans[spk], x), atol=1e-3)


def test_sat_trains_on_adapted_features_and_its_transforms_start_from_the_source(yesno, dask_client_1,
                                                                                 tmp_path) -> None:
    """A GMM trained on fMLLR-adapted features (deltas already in them), with a tree from the source
    system's alignments (train_sat.sh with the transforms fixed); its own transforms start from the
    source's, so the written features are the raw features through (new estimate ∘ source transform)."""
    config, shards, lang = yesno
    root = lang.parent
    config = {**config, "gmm": {**config["gmm"], "sat": {**config["gmm"]["sat"], "iterations": 4,
                                                         "realign_iterations": [2], "leaves": 40,
                                                         "gaussians": 200, "min_leaf_count": 20}}}
    mono, _ = _train(config, shards, lang, dask_client_1)
    mono.model.save(tmp_path / "mono")
    save_alignments(tmp_path / "mono" / "ali", mono.model, mono.alignments)
    make_graph(lang, tmp_path / "mono", tmp_path / "graph_mono", log=QUIET)
    mfcc = Paths(out=tmp_path / "fmllr_mono", data=root / "data", features=root / "mfcc", lang=lang)
    align_split(config, "mono", tmp_path / "mono", "train_sp", root / "data", root / "mfcc", lang,
                tmp_path / "align_mono", dask_client_1, log=QUIET)
    adapt_splits(config, "mono", "train", mfcc.replace(gmm=tmp_path / "mono", graph=tmp_path / "graph_mono",
                                                       alignments=tmp_path / "align_mono"), dask_client_1, log=QUIET)
    adapted_shards = split_shards(root / "data", tmp_path / "fmllr_mono", lang, "train", 4, deltas=0)
    assert features(adapted_shards[0])[0].shape[1] == 39  # adapted MFCC+Δ+ΔΔ, used as they are
    sat = train_tri(config, adapted_shards, lang, mono.model, mono.alignments, dask_client_1, lambda *_: None, QUIET,
                    system="sat")
    assert len(sat.alignments) == 31 and sat.model.am.num_pdfs > mono.model.am.num_pdfs
    sat.model.save(tmp_path / "sat")
    save_alignments(tmp_path / "sat" / "ali", sat.model, sat.alignments)
    # the speed-perturbed copies aligned by sat on their source-adapted features (align_fmllr.sh)
    copies = align_split(config, "sat", tmp_path / "sat", "train_sp", root / "data", tmp_path / "fmllr_mono", lang,
                         tmp_path / "align_sat", dask_client_1, log=QUIET)
    assert copies["utterances"] == 93 and copies["aligned"] >= 90
    make_graph(lang, tmp_path / "sat", tmp_path / "graph_sat", log=QUIET)
    out = tmp_path / "fmllr_sat"
    manifest = adapt_splits(config, "sat", "train", mfcc.replace(out=out, gmm=tmp_path / "sat",
                                                                graph=tmp_path / "graph_sat",
                                                                init=tmp_path / "fmllr_mono"), dask_client_1, log=QUIET)
    assert manifest["started_from"] == str(tmp_path / "fmllr_mono")
    assert all(g > 0 for s in manifest["splits"].values() for g in s["gain_per_frame_by_pass"][:1])
    for split in ("train", "test"):
        start, final = (read_transforms(d / split / "trans.txt") for d in (tmp_path / "fmllr_mono", out))
        assert set(start) == set(final) == {"global"}  # yesno: one speaker
        assert not np.allclose(start["global"], final["global"], atol=1e-3)  # re-estimated against sat
        raw = split_shards(root / "data", root / "mfcc", lang, split, 50)[0]
        written = read_scp(out / split / "feats.scp")
        utt, x = raw.utts[0], features(raw)[0]
        np.testing.assert_allclose(load(written[utt]), fmllr.apply(final["global"], x), atol=1e-3)


def test_lda_mllt_system_trains_on_projected_features_from_the_tri_alignments(yesno, dask_client_1,
                                                                              tmp_path) -> None:
    """train_lda_mllt.sh: LDA over the tri's pdfs projects 7 spliced 13-dim frames to ``dim``; each MLLT update
    raises its objective, and the model's likelihood grows; the folder keeps the final projection, which is
    how the system's features are read again."""
    config, shards, lang = yesno
    root = lang.parent
    small = {"iterations": 7, "realign_iterations": [3, 5], "leaves": 30, "gaussians": 150, "min_leaf_count": 20}
    gmm = config["gmm"]
    config = {**config, "gmm": {**gmm, "tri": {**gmm["tri"], **small},
                                "lda": {**gmm["lda"], **small, "dim": 20, "mllt_iterations": [2, 4]}}}
    mono, _ = _train(config, shards, lang, dask_client_1)
    tri = train_tri(config, shards, lang, mono.model, mono.alignments, dask_client_1, lambda *_: None, QUIET)

    def through(projection):
        return split_shards(root / "data", root / "mfcc", lang, "train", 4, deltas=0, projection=projection)

    steps: list[dict] = []
    lda = train_lda(config, through, lang, tri.model, tri.alignments, dask_client_1, lambda i, m: steps.append(m),
                    QUIET)
    assert lda.projection.matrix.shape == (20, 91) and lda.projection.context == 3
    assert len(lda.info["mllt_gain_per_frame"]) == 2 and all(g > 0 for g in lda.info["mllt_gain_per_frame"])
    assert len(lda.alignments) == 31 and lda.model.am.dim == 20
    assert steps[-1]["loglike_per_frame"] > steps[0]["loglike_per_frame"]
    lda.projection.save(tmp_path)
    again = split_shards(root / "data", root / "mfcc", lang, "train", 4, **gmm_features(tmp_path))
    np.testing.assert_allclose(features(again[0])[0], lda.projection(features(through(None)[0])[0]), atol=1e-4)
    # stopped after its first MLLT update (iteration 2) and rerun: it goes on through the projection reached
    def stop_after_2(step: int, metrics: dict) -> None:
        if step == 2:
            raise _Stopped

    with pytest.raises(_Stopped):
        train_lda(config, through, lang, tri.model, tri.alignments, dask_client_1, stop_after_2, QUIET,
                  GmmState(tmp_path / "state", "lda", QUIET))
    resumed = train_lda(config, through, lang, tri.model, tri.alignments, dask_client_1, lambda *_: None, QUIET,
                        GmmState(tmp_path / "state", "lda", QUIET))
    np.testing.assert_allclose(resumed.projection.matrix, lda.projection.matrix, atol=1e-6)
    assert resumed.info["mllt_gain_per_frame"] == lda.info["mllt_gain_per_frame"]
    assert resumed.model.to_bytes() == lda.model.to_bytes()


def test_gmm_decodes_search_every_pdfs_likelihoods_and_find_what_kaldis_lattice_decoder_finds(yesno, dask_client_1,
                                                                                           tmp_path) -> None:
    """A GMM decode searches a matrix of every pdf's log-likelihoods, computed once per utterance in blocks of
    frames; it matches the wheels' per-pdf GMM likelihoods, and the faster decoder on it finds the words Kaldi's
    lattice decoder finds on the wheels' own GMM decodable (gmm-latgen-faster), for one setting and for
    several sharing the matrix, ending in a final state (a search that ignores the final weights ends
    mid-word, with a word too many)."""
    from asrflow.decode.decoder import DecodeOptions, _graph, decode_shard_settings, words_of
    from asrflow.kaldi import khg

    config, shards, lang = yesno
    mono, _ = _train(config, shards, lang, dask_client_1)
    x = features(shards[0])[0]
    matrix = mono.model.pdf_loglikes(x)
    np.testing.assert_allclose(mono.model.pdf_loglikes(x, block=7), matrix, rtol=1e-6)
    for pdf in (0, 3, mono.model.am.num_pdfs - 1):
        ll = np.asarray(mono.model.am.get_pdf(pdf).log_likelihoods_matrix(x), dtype=np.float64)
        np.testing.assert_allclose(matrix[:, pdf], np.logaddexp.reduce(ll, axis=1), rtol=1e-4, atol=1e-3)
    mono.model.save(tmp_path / "mono")
    make_graph(lang, tmp_path / "mono", tmp_path / "graph", log=QUIET)
    graph, blob = str(tmp_path / "graph" / "HCLG.fst"), mono.model.to_bytes()
    table = (tmp_path / "graph" / "words.txt").read_text().splitlines()
    id2word = {int(i): w for w, i in (line.split() for line in table)}
    id2word = [id2word.get(i, "") for i in range(max(id2word) + 1)]
    settings = [DecodeOptions(acoustic_scale=0.1), DecodeOptions(acoustic_scale=0.2),
                DecodeOptions(acoustic_scale=0.05, insertion_penalty=1.0)]
    shared = decode_shard_settings(shards[0], blob, graph, settings)
    (alone,) = decode_shard_settings(shards[0], blob, graph, settings[:1])
    assert alone.hyps == shared[0].hyps
    for opts, result in zip(settings, shared):
        hclg, _ = _graph(graph, opts.insertion_penalty)  # the decoder holds a pointer to it: keep it alive
        reference = khg.LatticeFasterDecoder(hclg, khg.LatticeFasterDecoderConfig(beam=13.0, max_active=7000,
                                                                                  lattice_beam=6.0))
        for utt, feats in zip(shards[0].utts, features(shards[0])):
            decodable = khg.DecodableAmDiagGmmScaled(am=mono.model.am, tm=mono.model.tm, feats=feats,
                                                     scale=opts.acoustic_scale)
            ok, _, words, _ = khg.decode_utterance_lattice_faster(decoder=reference, decodable=decodable,
                                                                  trans_model=mono.model.tm, utt=utt,
                                                                  allow_partial=True)
            assert ok and result.hyps[utt] == words_of([int(w) for w in words], id2word).split(), (opts, utt)


def test_benchmarks_time_the_e_step_and_score_decodes_per_setting(yesno, dask_client_1, tmp_path) -> None:
    """asrflow bench gmm (E-step vs workers) and bench decode (RTF and WER per beam and scale on every n-th
    test utterance, against Kaldi's lattice-faster decoder and the graph as a VectorFst on the same likelihoods)
    run on a trained system."""
    from asrflow.gmm.bench import decode_benchmark, run_benchmark

    config, shards, lang = yesno
    root = lang.parent
    mono, _ = _train(config, shards, lang, dask_client_1)
    mono.model.save(tmp_path / "mono")
    make_graph(lang, tmp_path / "mono", tmp_path / "graph", log=QUIET)
    report = run_benchmark(config, root / "data", root / "mfcc", lang, tmp_path / "mono", "train", [1], repeats=1,
                           log=QUIET)
    assert report["utterances"] == 31 and report["runs"][1]["align_rtf"] > 0
    rows = decode_benchmark(config, tmp_path / "mono", tmp_path / "graph", root / "data", root / "mfcc", lang, "test",
                            3, [(13.0, 7000), (8.0, 500)], [0.1], lattice=True, vector=True, log=QUIET)
    assert [(r["beam"], r["utterances"]) for r in rows] == [(13.0, 10), (8.0, 10)]
    assert all(0 < r["rtf_search"] < r["rtf"] < 1 and 0 <= r["wer"] < 0.5 for r in rows)
    # the same likelihoods searched by Kaldi's lattice-faster decoder give the same words
    assert all(r["words_differ"] == 0 and r["lattice_rtf_search"] > 0 and r["partial_paths"] == 0 for r in rows)
    # and through the graph held as a VectorFst (decoding holds it as a ConstFst): the same words
    assert all(r["vector_words_differ"] == 0 and r["vector_rtf_search"] > 0 and r["const_speedup"] > 0 for r in rows)


def test_alignment_spectrogram_frames_and_peaks(tmp_path) -> None:
    """The alignment plot's spectrogram: Kaldi's framing (25 ms every 10 ms, no padding), 129 bins up
    to 4 kHz, a tone's energy in its bin, and dB from 0 at the peak down to at most 80 below."""
    from asrflow.gmm.stage import spectrogram

    wav = write_wav(tmp_path / "tone.wav", seconds=0.7, freq=1000.0)
    image = spectrogram(str(wav), 8000)
    assert image.shape == (129, 1 + (5600 - 256) // 80)
    assert set(np.argmax(image, axis=0)) == {32}  # 1000 Hz / (8000 Hz / 256 points)
    assert image.max() == 0.0 and image.min() >= -80.0
    # the same numbers for one frame from an explicit DFT of its windowed samples
    samples, _ = sf.read(wav)
    window = np.zeros(256)
    window[28:228] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(200) / 200)
    frame = samples[80 * 5:80 * 5 + 256] * window
    dft = np.abs(np.exp(-2j * np.pi * np.outer(np.arange(129), np.arange(256)) / 256) @ frame) ** 2
    peak = dft.max() / 10 ** (image[:, 5].max() / 10)  # the image's 0 dB (its loudest frame)
    np.testing.assert_allclose(image[:, 5], np.maximum(10 * np.log10(dft / peak), -80.0), atol=1e-6)


def test_the_scale_benchmark_replicates_the_split_and_the_driver_receives_one_total(yesno, dask_client_1,
                                                                                    tmp_path) -> None:
    """bench scale: the split copied under new ids up to each size (same features), each stage over it with its
    driver in a process of its own (every stage at one size; those named, and what they need, at two); the total
    the driver receives is the model's statistics, whatever the size; every size decodes the same fixed test set
    through its own LM and graph."""
    from asrflow.scale.gmm import replicate
    from asrflow.scale.run import scale_benchmark

    config, shards, lang = yesno
    root = lang.parent
    counts = replicate(root / "data", root / "mfcc", "train", 0.1, tmp_path / "copy")
    assert counts["frames"] >= 0.1 * 360_000 and counts["copies"] >= 2
    copied = read_table(tmp_path / "copy" / "features" / "train" / "feats.scp")
    original = read_table(root / "mfcc" / "train" / "feats.scp")
    assert all(copied[u] == original[u.split("-", 1)[1]] for u in copied)
    result, _ = _train(config, shards, lang, dask_client_1)
    result.model.save(tmp_path / "mono")
    config = copy.deepcopy(config)
    config["gmm"]["mono"]["subset"] = 10  # the mono stage's pass: 10 utterances whatever the size
    lines = scale_benchmark(config, root / "data", root / "mfcc", lang, tmp_path / "mono", "train", [0.1], 1,
                            log=QUIET, test_minutes=1.0, tune_utterances=3)
    names = ["mono", "realign", "accumulate", "tree", "fmllr", "alignments", "nnet_read", "lang", "lang_20k", "decode",
             "score", "tune", "mlflow"]
    assert [line["stage"] for line in lines] == names
    for line in lines:
        assert line["wall_s"] >= 0 and line["cpu_s"] >= 0 and line["peak_rss_driver_mb"] > 10, line
        with_workers = line["stage"] in ("mono", "realign", "accumulate", "tree", "fmllr", "decode", "tune")
        assert (line["peak_rss_worker_mb"] is not None) == with_workers, line
        if with_workers:  # what a worker held at the start is part of its peak
            assert 10 < line["start_rss_worker_mb"] <= line["peak_rss_worker_mb"], line
    assert [line["stage"] for line in lines if line["fresh_workers"]] == [
        "mono", "realign", "tree", "fmllr", "decode", "tune"]  # accumulate: on realign's workers
    large = {line["stage"]: line for line in lines}
    assert large["mono"]["subset"] == 10 and not large["mono"]["failed"] and not large["realign"]["failed"]
    assert large["tree"]["leaves"] > 1 and 0 < large["fmllr"]["adapted"] <= large["fmllr"]["speakers"]
    assert large["alignments"]["alignments_mb"] > 0 and large["nnet_read"]["frames_per_second"] > 0
    assert large["lang_20k"]["words"] > large["lang"]["words"] == 2  # yes, no; and CMUdict words of their phones
    assert large["lang_20k"]["graph_states"] > large["lang"]["graph_states"]
    assert 0 <= large["score"]["wer"] < 0.5 and large["tune"]["settings"] == 4
    assert 0 < large["tune"]["tuned_utterances"] <= 3 and large["mlflow"]["artifacts"] > 3
    # two sizes of the stages named and what they need: the replicated split grows, the total the driver receives
    # (the model's statistics) and the fixed test set do not
    both = scale_benchmark(config, root / "data", root / "mfcc", lang, tmp_path / "mono", "train", [0.05, 0.1], 1,
                           log=QUIET, stages=["accumulate", "decode"], test_minutes=1.0)
    assert [line["stage"] for line in both] == ["realign", "accumulate", "lang", "decode"] * 2
    small, large = ({line["stage"]: line for line in both[i:i + 4]} for i in (0, 4))
    assert small["realign"]["hours"] >= 0.05 and large["realign"]["hours"] >= 0.1
    assert large["realign"]["utterances"] > small["realign"]["utterances"]
    assert not small["realign"]["failed"] and not large["realign"]["failed"]
    assert small["accumulate"]["reduced_mb"] == large["accumulate"]["reduced_mb"]  # the model's statistics only
    assert small["decode"]["test_utterances"] == large["decode"]["test_utterances"] > 0
    with pytest.raises(ValueError, match="unknown stages"):
        scale_benchmark(config, root / "data", root / "mfcc", lang, tmp_path / "mono", "train", [0.05], 1,
                        log=QUIET, stages=["decoding"])
    with pytest.raises(ValueError, match="audio cache"):
        scale_benchmark(config, root / "data", root / "mfcc", lang, tmp_path / "mono", "train", [0.05], 1,
                        log=QUIET, stages=["import"])


def test_the_scale_benchmark_gives_each_workflow_job_its_own_workers() -> None:
    """A stage that starts a workflow job starts a cluster; an accumulating pass right after an aligning one runs
    on that job's workers, and stages without workers join the job before them."""
    from asrflow.scale.run import jobs

    assert jobs(["mono", "realign", "accumulate", "tree", "alignments", "nnet_read", "decode"]) == [
        ["mono"], ["realign", "accumulate"], ["tree", "alignments", "nnet_read"], ["decode"]]
    assert jobs(["accumulate", "realign"]) == [["accumulate"], ["realign"]]  # not after its aligning pass
    assert jobs(["lang", "decode"]) == [["lang"], ["decode"]]


def test_the_scale_benchmark_makes_sizes_from_perturbed_audio_written_once(yesno, dask_client_1, tmp_path) -> None:
    """bench scale with an audio cache: each size a Kaldi data dir of the split's audio and its speed and volume
    perturbed copies (new utterances and speakers), imported and featurised by the stages' own code; the copies
    are written once and reused by a larger size."""
    import soundfile as sf

    from asrflow.scale.corpus import copy_factors, sized_corpus
    from asrflow.scale.run import scale_benchmark

    config, shards, lang = yesno
    root = lang.parent
    source = read_table(root / "data" / "train" / "wav.scp")
    first = sized_corpus(root / "data", "train", 0.08, tmp_path / "cache", tmp_path / "small", 8000, workers=1,
                         log=QUIET)
    assert first["copies"] >= 2 and first["audio_hours"] >= 0.08
    wavs = read_table(tmp_path / "small" / "train" / "wav.scp")
    assert all(wavs[f"c0-{u}"] == source[u] for u in source if f"c0-{u}" in wavs)  # copy 0: the audio itself
    speed, volume = copy_factors(1, 0)
    assert speed == 0.9 and 0.125 <= volume <= 2.0
    utt = sorted(source)[0]
    original, copy = sf.read(source[utt])[0], sf.read(wavs[f"c1-{utt}"])[0]
    assert abs(len(copy) - len(original) / 0.9) <= 2  # played at 0.9: longer
    assert read_table(tmp_path / "small" / "train" / "utt2spk")[f"c1-{utt}"].startswith("c1-")
    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*.wav")}
    sized_corpus(root / "data", "train", 0.12, tmp_path / "cache", tmp_path / "large", 8000, workers=1, log=QUIET)
    assert all(p.stat().st_mtime_ns == t for p, t in written.items())  # reused, not written again
    assert len(list((tmp_path / "cache").rglob("*.wav"))) > len(written)
    result, _ = _train(config, shards, lang, dask_client_1)
    result.model.save(tmp_path / "mono")
    lines = scale_benchmark(config, root / "data", root / "mfcc", lang, tmp_path / "mono", "train", [0.08], 1,
                            log=QUIET, stages=["import", "realign"], audio_cache=tmp_path / "cache")
    assert [line["stage"] for line in lines] == ["import", "features", "realign"]
    imported, features, realign = lines
    assert imported["imported"] == imported["utterances"] == first["utterances"] and not imported["rejected"]
    assert features["frames"] > 0 and not features["failed"] and not realign["failed"]


def test_utterances_with_the_same_words_share_one_training_graph(yesno, dask_client_1) -> None:
    """A worker compiles one graph per transcript: speed-perturbed copies (same words, other ids) reuse it; a
    new tree's graphs replace the previous tree's."""
    import dataclasses

    from asrflow.gmm import estep

    config, shards, lang = yesno
    result, _ = _train(config, shards, lang, dask_client_1)
    shard = shards[0]
    copy = dataclasses.replace(shard, utts=[f"sp0.9-{u}" for u in shard.utts], key=f"copy-{shard.key}")
    tree = estep.tree_key(result.model)
    estep._GRAPHS.clear()
    first = estep.training_graph(result.model, shard, 0, tree)
    assert estep.training_graph(result.model, copy, 0, tree) is first and len(estep._GRAPHS) == 1
    assert estep.graph_bytes(first) > 256
    estep.training_graph(result.model, shard, 1, b"next")  # another tree's graphs: the first tree's go
    assert [key[1] for key in estep._GRAPHS] == [b"next"]
