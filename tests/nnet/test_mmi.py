"""MMI against the decoding graph: the forward algorithm against path enumeration, its gradient,
the HCLG conversion, the config checks and a training run with it."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from asrflow.gmm.alignments import write_alignments
from asrflow.nnet.mmi import (
    MmiObjective,
    denominator_from_fst,
    denominator_log_prob,
    graph_from_arcs,
    load_denominator_graph,
    mmi,
)

from .helpers import synthetic_split

# A small graph over 3 pdfs with costs, two final states and a cycle through all three.
ARCS = [(0, 1, 0, 0.5), (0, 2, 1, 1.0), (1, 1, 0, 0.2), (1, 2, 1, 0.7), (2, 2, 1, 0.1), (2, 1, 2, 2.0),
        (2, 3, 2, 0.3), (3, 3, 2, 0.4), (3, 0, 0, 1.5)]
FINALS = {2: 0.25, 3: 0.0}


def brute_force(loglikes: np.ndarray, length: int) -> float:
    """log Σ over every path of ``length`` arcs from state 0 to a final state."""
    total = []
    for path in itertools.product(range(len(ARCS)), repeat=length):
        state, score = 0, 0.0
        for t, a in enumerate(path):
            src, dst, pdf, cost = ARCS[a]
            if src != state:
                break
            state, score = dst, score + loglikes[t, pdf] - cost
        else:
            if state in FINALS:
                total.append(score - FINALS[state])
    return float(np.logaddexp.reduce(total))


def test_forward_sums_every_path_of_each_utterance() -> None:
    graph = graph_from_arcs(ARCS, FINALS, 0, 4)
    # state-emitting: a start no arc enters, then one state per (state, pdf entering it): 0 by pdf 0, 1 by pdfs 0
    # and 2, 2 by pdf 1, 3 by pdf 2; each arc leaves every copy of its source (states 0 and 1 have two each)
    assert graph.num_states == 6 and graph.pdf.tolist() == [0, 0, 0, 2, 1, 2]
    assert graph.num_arcs == len(ARCS) + 2 + 2
    rng = np.random.default_rng(0)
    loglikes = rng.normal(scale=3.0, size=(2, 5, 3))
    got = denominator_log_prob(torch.from_numpy(loglikes), torch.tensor([5, 3]), graph)
    assert got[0].item() == pytest.approx(brute_force(loglikes[0], 5), abs=1e-9)
    assert got[1].item() == pytest.approx(brute_force(loglikes[1], 3), abs=1e-9)  # padding frames ignored


def test_forward_survives_long_utterances_and_large_scores() -> None:
    graph = graph_from_arcs(ARCS, FINALS, 0, 4)
    loglikes = torch.full((1, 3000, 3), -400.0, dtype=torch.float64)
    loglikes[0, :, 1] = 0.0
    value = denominator_log_prob(loglikes, torch.tensor([3000]), graph)
    assert math.isfinite(value.item())


def test_denominator_speed_times_both_passes() -> None:
    from asrflow.nnet.mmi import denominator_speed

    row = denominator_speed(graph_from_arcs(ARCS, FINALS, 0, 4), 3, batch=2, frames=50, repeats=2)
    assert set(row) == {"forward_s", "backward_s", "ms_per_frame"}
    assert row["forward_s"] > 0 and row["backward_s"] > 0
    # the best repeat's total is at least the two passes' bests; the times are rounded to 0.1 ms (each up to
    # 0.05 ms off, 0.1 ms together: 0.002 ms per frame of 50) and ms_per_frame to 0.001 ms
    assert row["ms_per_frame"] >= 1000 * (row["forward_s"] + row["backward_s"]) / 50 - (0.1 / 50 + 0.0005)


def test_gradient_is_the_denominator_occupancy() -> None:
    graph = graph_from_arcs(ARCS, FINALS, 0, 4)
    loglikes = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 4])
    assert torch.autograd.gradcheck(lambda x: denominator_log_prob(x, lengths, graph), (loglikes,))
    denominator_log_prob(loglikes, lengths, graph).sum().backward()
    occupancy = loglikes.grad.sum(dim=2)  # each frame of each utterance is consumed by exactly one arc
    assert torch.allclose(occupancy[0], torch.ones(6, dtype=torch.float64))
    assert torch.allclose(occupancy[1], torch.tensor([1.0, 1, 1, 1, 0, 0], dtype=torch.float64))


def test_mmi_is_low_when_the_aligned_path_dominates() -> None:
    graph = graph_from_arcs(ARCS, FINALS, 0, 4)
    targets = torch.tensor([[0, 0, 1, 1, 2]])
    sharp = torch.full((1, 5, 3), -30.0, dtype=torch.float64)
    sharp[0, torch.arange(5), targets[0]] = 0.0
    flat = torch.zeros(1, 5, 3, dtype=torch.float64)
    lengths = torch.tensor([5])
    # sharp: only the aligned path survives, so MMI is its graph cost (0.5 + 0.2 + 0.7 + 0.1 + 0.3, final 0)
    assert mmi(sharp, lengths, targets, graph).item() == pytest.approx(-1.8, abs=1e-6)
    assert mmi(flat, lengths, targets, graph).item() > mmi(sharp, lengths, targets, graph).item() + 1.0


def test_objective_adds_weighted_mmi_to_cross_entropy() -> None:
    from asrflow.nnet.objectives import frame_cross_entropy

    graph = graph_from_arcs(ARCS, FINALS, 0, 4)
    priors = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    logits = torch.randn(1, 5, 3, requires_grad=True)
    batch = {"targets": torch.tensor([[0, 0, 1, 1, 2]]), "target_lengths": torch.tensor([5])}  # as collate makes it
    lengths = torch.tensor([5])
    loss, stats = MmiObjective(graph, priors, 0.5, 0.1)(logits, lengths, batch)
    ce, _ = frame_cross_entropy(logits, lengths, batch)
    loglikes = 0.1 * (torch.log_softmax(logits.double(), -1) - priors.double())
    expected = ce.item() + 0.5 * mmi(loglikes, lengths, batch["targets"], graph).item() / 5
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats.count == 5 and stats.parts["mmi"] / 5 == pytest.approx((expected - ce.item()) / 0.5, rel=1e-5)
    loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_hclg_conversion_maps_transition_ids_and_removes_epsilons(tmp_path: Path) -> None:
    from asrflow.kaldi import kfst

    # transition ids 1..4 → pdfs 0, 0, 1, 2; an ε-input arc (with a word on its output) from the start
    text = "0 1 0 7 0.5\n1 1 1 0 0.1\n1 2 3 5 0.2\n2 2 4 0 0.3\n2 1 2 0 1.0\n2 0.7\n"
    fst = kfst.compile(text)
    fst.write(str(tmp_path / "HCLG.fst"))
    graph = load_denominator_graph(tmp_path / "HCLG.fst", np.array([0, 0, 0, 1, 2]))
    # the ε arc's cost moved onto the arcs after it; state-emitting: the start, then state 1 entered by pdf 0 and
    # state 2 entered by pdfs 1 and 2 (two states)
    assert graph.num_states == 4 and graph.start == 0 and graph.pdf.tolist() == [0, 0, 1, 2]
    loglikes = np.log(np.random.default_rng(1).uniform(0.1, 1.0, size=(1, 4, 3)))
    # paths of 4 frames, by hand: 0.5 (ε) then 1→1 / 1→2 / 2→2 / 2→1 with the final 0.7 at state 2
    arcs = {1: [(1, 0, 0.1), (2, 1, 0.2)], 2: [(2, 2, 0.3), (1, 0, 1.0)]}
    paths = []
    for choice in itertools.product(range(2), repeat=4):
        state, score = 1, -0.5
        for t, c in enumerate(choice):
            dst, pdf, cost = arcs[state][c]
            state, score = dst, score + loglikes[0, t, pdf] - cost
        if state == 2:
            paths.append(score - 0.7)
    got = denominator_log_prob(torch.from_numpy(loglikes), torch.tensor([4]), graph).item()
    assert got == pytest.approx(float(np.logaddexp.reduce(paths)), abs=1e-5)
    with pytest.raises(FileNotFoundError, match="HCLG.fst"):
        load_denominator_graph(tmp_path / "missing" / "HCLG.fst", np.zeros(5, dtype=int))


def test_states_that_accept_the_same_pdf_sequences_are_merged() -> None:
    """Two branches reading the same pdfs at the same costs (through different transition ids, as two copies of
    a context-dependent phone sharing its tied states) become one, as in Kaldi's den.fst: the two identical
    paths are summed once."""
    from asrflow.kaldi import kfst

    # tids 1, 2 -> pdf 0; tids 3, 4 -> pdf 1: start → a (tid 1) → b (tid 3) and start → c (tid 2) → d (tid 4)
    text = "0 1 1 0 0.4\n0 2 2 0 0.4\n1 3 3 0 0.2\n2 4 4 0 0.2\n3 3 3 0 0.1\n4 4 4 0 0.1\n3 0.3\n4 0.3\n"
    graph = denominator_from_fst(kfst.compile(text), np.array([0, 0, 0, 1, 1]))
    assert graph.num_states == 3 and graph.num_arcs == 3  # the start, then one state per pdf
    loglikes = torch.log(torch.tensor([[[0.3, 0.6], [0.2, 0.9], [0.5, 0.4]]], dtype=torch.float64))
    # one path of 3 frames (the two identical ones merged): pdf 0 then pdf 1 twice
    expected = float(loglikes[0, 0, 0] + loglikes[0, 1, 1] + loglikes[0, 2, 1]) - (0.4 + 0.2 + 0.1 + 0.3)
    got = denominator_log_prob(loglikes, torch.tensor([3]), graph).item()
    assert got == pytest.approx(expected, abs=1e-4)


def test_config_allows_mmi_for_whole_utterance_hybrids_only() -> None:
    from asrflow.config import ConfigError, resolve_config

    def config(model: dict) -> dict:
        return resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "evaluation": {"systems": ["net"]},
                               "nnet": {"models": {"net": model}}})

    config({"type": "dnn", "train": {"mmi": {"weight": 1.0}}})
    with pytest.raises(ConfigError, match="MMI trains hybrid networks"):
        config({"type": "dnn", "objective": "ctc", "train": {"mmi": {"weight": 1.0}}})
    with pytest.raises(ConfigError, match="chunk_frames"):
        config({"type": "lstm", "train": {"mmi": {"weight": 1.0}, "chunk_frames": 50}})
    with pytest.raises(ConfigError):
        config({"type": "dnn", "train": {"mmi": {"weigth": 1.0}}})
    config({"type": "dnn", "train": {"mmi": {"weight": 1.0, "denominator": "phone_lm", "phone_lm_order": 2}}})
    with pytest.raises(ConfigError, match="phone_lm"):
        config({"type": "dnn", "train": {"mmi": {"weight": 1.0, "denominator": "phone-lm"}}})
    config({"type": "cnn", "channels": [], "train": {"mmi": {"weight": 1.0, "cross_entropy": "separate"}}})
    with pytest.raises(ConfigError, match="one linear output layer"):
        config({"type": "cnn", "multi_frame": 3, "tdnn_dilations": [1, 3],
                "train": {"mmi": {"weight": 1.0, "cross_entropy": "separate"}}})
    with pytest.raises(ConfigError, match="tolerance.*chain alignment"):
        config({"type": "dnn", "train": {"mmi": {"weight": 1.0, "tolerance": 1}}})


def test_a_separate_cross_entropy_output_takes_the_cross_entropy_and_leaves_the_output_to_mmi() -> None:
    from asrflow.nnet.models import CrossEntropyOutput, build_model
    from asrflow.nnet.objectives import frame_cross_entropy

    torch.manual_seed(0)
    config = {"type": "cnn", "channels": [], "tdnn_dim": 16, "tdnn_dilations": [1, 2], "subsampling": 3}
    plain = build_model(config, 5, 3)
    torch.manual_seed(0)
    model = build_model({**config, "xent_output": True}, 5, 3)
    assert isinstance(model.output, CrossEntropyOutput)
    assert set(model.state_dict()) == set(plain.state_dict()) | {"output.xent.weight", "output.xent.bias"}
    x, lengths = torch.randn(2, 13, 5), torch.tensor([13, 10])
    logits, out_lengths = model.eval()(x, lengths)
    assert torch.equal(logits, plain.eval()(x, lengths)[0])  # the first output is the network's own
    logits, out_lengths = model.train()(x, lengths)
    assert model.output.xent_logits.shape == logits.shape
    assert not torch.allclose(model.output.xent_logits, logits)
    targets = torch.randint(3, (2, logits.shape[1]))
    targets[1, out_lengths[1]:] = -100
    batch = {"targets": targets, "target_lengths": out_lengths}
    arcs = [(0, c + 1, c, 1.0) for c in range(3)] + [(a + 1, b + 1, b, 0.5) for a in range(3) for b in range(3)]
    graph = graph_from_arcs(arcs, {c + 1: 0.0 for c in range(3)}, 0, 4)
    # cross-entropy alone: it reaches the second output and never the first
    objective = MmiObjective(graph, torch.zeros(3), 0.0, 1.0, separate=True)
    objective.attach(model)
    loss, _ = objective(logits, out_lengths, batch)
    assert loss.item() == pytest.approx(frame_cross_entropy(model.output.xent_logits, out_lengths, batch)[0].item())
    loss.backward()
    assert model.output.weight.grad is None or not model.output.weight.grad.any()
    assert model.output.xent.weight.grad.abs().sum() > 0
    # MMI alone: the first output only
    model.zero_grad(set_to_none=True)
    objective = MmiObjective(graph, torch.zeros(3), 1.0, 1.0, separate=True)
    objective.attach(model)
    logits, out_lengths = model(x, lengths)
    mmi_only = objective(logits, out_lengths, batch)[0] - frame_cross_entropy(model.output.xent_logits, out_lengths,
                                                                              batch)[0]
    mmi_only.backward()
    assert model.output.weight.grad.abs().sum() > 0 and not model.output.xent.weight.grad.any()
    with pytest.raises(ValueError, match="built with one"):
        MmiObjective(graph, torch.zeros(3), 1.0, 1.0, separate=True).attach(plain)


def test_the_network_stage_writes_final_pt_without_the_cross_entropy_output() -> None:
    from asrflow.nnet.models import build_model
    from asrflow.nnet.stage import with_xent_weights, without_xent_output

    config = {"type": "dnn", "hidden": 8, "layers": 1, "context": 1}
    trained = build_model({**config, "xent_output": True}, 4, 3)
    saved = {"config": {**config, "xent_output": True}, "model": trained.state_dict(), "num_classes": 3}
    decoding = without_xent_output(saved)
    assert "xent_output" not in decoding["config"] and not any(k.startswith("output.xent") for k in decoding["model"])
    build_model(decoding["config"], 4, 3).load_state_dict(decoding["model"])  # strict: exactly the decoder's network
    again = with_xent_weights(decoding)  # fine-tuning it with a separate output again: the output's copy
    assert torch.equal(again["model"]["output.xent.weight"], again["model"]["output.weight"])
    build_model(saved["config"], 4, 3).load_state_dict(again["model"])


def test_training_with_mmi_learns_and_logs_its_term(tmp_path: Path) -> None:
    from asrflow.config.settings import Training
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.train import train

    labels = synthetic_split(tmp_path, utterances=24)
    # a class loop: any class may follow any other, each held for at least one frame
    arcs = [(0, c + 1, c, 1.0) for c in range(4)] + [(a + 1, b + 1, b, 0.0 if a == b else 2.0)
                                                      for a in range(4) for b in range(4)]
    graph = graph_from_arcs(arcs, {c + 1: 0.0 for c in range(4)}, 0, 5)
    priors = torch.log(torch.full((4,), 0.25))
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    logged: list[dict] = []
    opts = Training.defaults(epochs=4, max_frames=500, lr=1e-2, warmup_steps=2, patience=5, seed=1,
                        mmi={"weight": 1.0, "acoustic_scale": 0.5})
    summary = train({"type": "dnn", "hidden": 32, "layers": 1, "context": 1, "dropout": 0.0}, opts, data, data, 4,
                    tmp_path / "out", log_metrics=lambda step, m: logged.append(m), log=lambda *_: None,
                    criterion=MmiObjective(graph, priors, 1.0, 0.5))
    assert (tmp_path / "out" / "final.pt").is_file()
    assert summary["best_valid_frame_accuracy"] > 0.99
    steps = [m for m in logged if "mmi" in m]
    assert steps and steps[-1]["mmi"] < steps[0]["mmi"]


def test_the_training_stage_asks_for_the_graph_only_with_mmi_on(tmp_path: Path) -> None:
    from asrflow.config.settings import Training
    from asrflow.nnet import NnetError
    from asrflow.nnet.stage import mmi_criterion

    priors = torch.zeros(3)
    off = Training.defaults(mmi={"weight": 0.0, "acoustic_scale": 0.1})
    assert mmi_criterion(off, "dnn", None, None, priors) is None
    with pytest.raises(NnetError, match="--graph"):
        mmi_criterion(Training.defaults(mmi={"weight": 1.0, "acoustic_scale": 0.1}), "dnn", tmp_path, None, priors)


def test_phone_sequences_collapse_each_run_of_frames() -> None:
    from asrflow.nnet.phone_lm import phone_loop_text, phone_sequences

    names = {1: "SIL", 2: "Y", 3: "EH", 4: "S", 5: "N", 6: "OW"}
    frames = [np.array([1, 1, 2, 2, 2, 3, 4, 4, 1]), np.array([], dtype=np.int32), np.array([5, 6, 6])]
    assert phone_sequences(frames, names) == [["SIL", "Y", "EH", "S", "SIL"], ["N", "OW"]]
    assert phone_loop_text(["SIL", "N"]).splitlines() == ["0 0 SIL SIL", "0 0 N N", "0 0 #0 #0", "0"]


def test_the_phone_lm_denominator_needs_the_lang_and_the_alignments(tmp_path: Path) -> None:
    from asrflow.config.settings import Training
    from asrflow.nnet import NnetError
    from asrflow.nnet.phone_lm import phone_lm_graph
    from asrflow.nnet.stage import mmi_criterion

    settings = {"weight": 1.0, "acoustic_scale": 0.1, "denominator": "phone_lm", "phone_lm_order": 3}
    with pytest.raises(NnetError, match="--lang"):
        mmi_criterion(Training.defaults(mmi=settings), "dnn", tmp_path, tmp_path, torch.zeros(3))
    with pytest.raises(FileNotFoundError, match="ali/phones.scp"):
        phone_lm_graph(tmp_path, tmp_path, None, 3)
    tids = np.array([1, 1, 2, 3, 3, 5, 1])  # transition id t is phone t here; 5 is no phone of this lang
    write_alignments(tmp_path / "ali", np.zeros(8, int), np.arange(8), {"u1": tids})
    (tmp_path / "phones.txt").write_text("<eps> 0\nSIL 1\nY 2\nEH 3\n#0 4\n")  # another lang's phones
    with pytest.raises(NnetError, match=r"phone ids \['5'\] are not phones of"):
        phone_lm_graph(tmp_path, tmp_path, None, 3)
