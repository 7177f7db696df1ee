import numpy as np
import pytest

from asrflow.nnet.hybrid import pdf_priors, transition_loglikes


def test_priors_from_alignment_counts() -> None:
    priors = pdf_priors({"a": np.array([0, 0, 1]), "b": np.array([1, 1, 1])}, 3)
    assert np.exp(priors[:2]) == pytest.approx([2 / 6, 4 / 6])
    assert priors[2] == pytest.approx(np.log(1e-8))


def test_transition_columns_follow_their_pdfs() -> None:
    log_post = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]))
    log_prior = np.log(np.array([0.5, 0.25, 0.25]))
    tid2pdf = np.array([0, 0, 0, 1, 2, 2])  # index 0 unused, transition ids 1..5
    m = transition_loglikes(log_post, log_prior, tid2pdf, acoustic_scale=0.5)
    assert m.shape == (2, 5) and m.dtype == np.float32
    assert m[0, 0] == pytest.approx(0.5 * (np.log(0.7) - np.log(0.5)))
    assert m[1, 4] == pytest.approx(0.5 * (np.log(0.8) - np.log(0.25)))
    assert m[:, 0].tolist() == m[:, 1].tolist()  # two transitions of the same pdf


def test_hybrid_decode_options_fall_back_to_the_gmm_settings() -> None:
    from asrflow.config.settings import Decoding
    from asrflow.nnet.hybrid import decode_options

    gmm = {"beam": 13.0, "max_active": 7000}
    opts = decode_options(Decoding.defaults(acoustic_scale=0.1, insertion_penalty=0.0), gmm)
    assert (opts.beam, opts.max_active, opts.acoustic_scale, opts.insertion_penalty) == (13.0, 7000, 0.1, 0.0)
    opts = decode_options(Decoding.defaults(insertion_penalty=2.0, graph_beam=8.0, max_active=1000), gmm)
    assert opts.insertion_penalty == 2.0
    assert (opts.beam, opts.max_active) == (8.0, 1000)


def test_posterior_priors_are_the_network_s_average_posteriors() -> None:
    """Kaldi's adjust-priors: the log of the mean of the network's posteriors over every frame it is given,
    whatever the batching; pdfs it never predicts are floored."""
    import torch

    from asrflow.nnet.hybrid import posterior_priors
    from asrflow.nnet.inference import log_posteriors
    from asrflow.nnet.models import build_model

    torch.manual_seed(0)
    network = build_model({"type": "dnn", "hidden": 8, "layers": 1, "context": 1}, 4, 6).eval()
    with torch.no_grad():
        network.output.bias[5] = -80.0  # a pdf the network never predicts
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((n, 4)).astype(np.float32) for n in (5, 9, 3, 12, 7)]
    expected = np.concatenate([np.exp(log_posteriors(network, x)) for x in feats]).mean(axis=0)
    for batch in (1, 2, 32):
        priors, frames = posterior_priors(network, iter(feats), 6, batch=batch)
        assert frames == 36
        np.testing.assert_allclose(np.exp(priors[:5]), expected[:5], rtol=1e-5)
        assert priors[5] == pytest.approx(np.log(1e-8))


def test_prior_utterances_spread_over_the_split() -> None:
    from asrflow.nnet.hybrid import spread_indices

    assert spread_indices([10, 10, 10], 100) == [0, 1, 2]  # fewer frames than asked: all
    chosen = spread_indices([10] * 100, 200)
    assert len(chosen) == 20 and chosen[0] == 0 and chosen[-1] == 95 and len(set(chosen)) == 20
