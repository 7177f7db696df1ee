"""Wire compression: payload sizes, round trips, and error feedback that loses nothing over time."""

from __future__ import annotations

import pytest
import torch

from asrflow.parallel.compress import COMPRESSIONS, EightBit, ErrorFeedback, NoCompression, OneBit, make_compressor

SIZES = (1, 7, 8, 9, 1023, 1024, 1025, 5000)


@pytest.mark.parametrize("name", COMPRESSIONS)
@pytest.mark.parametrize("numel", SIZES)
def test_payload_is_one_uint8_vector_of_the_announced_size(name: str, numel: int) -> None:
    compressor = make_compressor(name, chunk=64)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    payload = compressor.compress(x)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() == compressor.payload_size(numel)
    out = compressor.decompress(payload, numel)
    assert out.dtype == torch.float32 and out.shape == (numel,)


def test_none_is_exact_and_does_not_alias_the_input() -> None:
    compressor = make_compressor("none")
    x = torch.randn(1001)
    payload = compressor.compress(x)
    assert torch.equal(compressor.decompress(payload, 1001), x)
    x.zero_()  # later changes to the input do not reach a payload already made
    assert compressor.decompress(payload, 1001).abs().sum() > 0


def test_8bit_error_is_at_most_half_a_step_per_element() -> None:
    chunk, numel = 100, 1234  # last chunk partial
    x = torch.randn(numel) * torch.linspace(0.01, 10, numel)  # very different scales per chunk
    x[200:300] = 0.0  # an all-zero chunk: scale 0, decodes to zeros
    compressor = EightBit(chunk)
    out = compressor.decompress(compressor.compress(x), numel)
    padded = torch.nn.functional.pad(x, (0, 13 * chunk - numel)).view(13, chunk)
    scale = (padded.abs().amax(1) / 127).repeat_interleave(chunk)[:numel]
    assert torch.all((out - x).abs() <= scale / 2 * (1 + 1e-5) + 1e-12)
    assert torch.equal(out[200:300], torch.zeros(100))
    assert torch.allclose(out.abs().view(-1)[x.abs().argmax()], x.abs().max())  # the largest value is exact


def test_1bit_keeps_signs_and_the_mean_absolute_value_per_chunk() -> None:
    chunk, numel = 16, 16 * 5 + 3  # numel not a multiple of 8 nor of the chunk
    x = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    compressor = OneBit(chunk)
    out = compressor.decompress(compressor.compress(x), numel)
    assert torch.equal(torch.sign(out), torch.where(x >= 0, 1.0, -1.0))
    for start in range(0, numel, chunk):
        part = x[start:start + chunk]
        assert torch.allclose(out[start:start + chunk].abs(), part.abs().mean().expand_as(part))
    assert torch.equal(compressor.decompress(compressor.compress(torch.tensor([-2.5])), 1), torch.tensor([-2.5]))


def test_1bit_is_more_than_20_times_smaller_and_fast() -> None:
    import time

    numel = 1_000_000
    none, one, eight = NoCompression(), OneBit(), EightBit()
    assert none.payload_size(numel) / one.payload_size(numel) >= 20
    assert none.payload_size(numel) / eight.payload_size(numel) >= 3.9
    x = torch.randn(numel)
    start = time.perf_counter()
    for compressor in (one, eight):
        compressor.decompress(compressor.compress(x), numel)
    assert time.perf_counter() - start < 1.0  # vectorised: milliseconds, not a Python loop over elements


@pytest.mark.parametrize("name", ["1bit", "8bit"])
def test_error_feedback_running_sum_tracks_the_inputs(name: str) -> None:
    numel, steps = 777, 200
    generator = torch.Generator().manual_seed(0)
    feedback = ErrorFeedback(make_compressor(name, chunk=100), numel)
    assert feedback.payload_size() == make_compressor(name, chunk=100).payload_size(numel)
    sent = torch.zeros(numel)
    received = torch.zeros(numel)
    biggest = 0.0
    for _ in range(steps):
        x = torch.randn(numel, generator=generator) + 0.3  # a bias a compressor without feedback would distort
        payload = feedback.compress(x)
        sent += x
        received += feedback.decompress(payload)
        assert torch.allclose(sent - received, feedback.residual, atol=1e-3)  # nothing lost, only delayed
        biggest = max(biggest, float(feedback.residual.abs().max()))
    assert biggest < 10  # the residual stays bounded (a random walk would reach ~sqrt(200) · 1.3)


def test_error_feedback_state_round_trip() -> None:
    feedback = ErrorFeedback(make_compressor("1bit", chunk=8), 50)
    for _ in range(3):
        feedback.compress(torch.randn(50))
    state = feedback.state_dict()
    restored = ErrorFeedback(make_compressor("1bit", chunk=8), 50)
    restored.load_state_dict(state)
    x = torch.randn(50)
    assert torch.equal(restored.compress(x), feedback.compress(x))
    assert torch.equal(restored.residual, feedback.residual)
    with pytest.raises(ValueError, match="49"):
        ErrorFeedback(make_compressor("1bit"), 49).load_state_dict(state)


def test_unknown_compression_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="none, 1bit, 8bit"):
        make_compressor("2bit")
    with pytest.raises(ValueError, match="payload"):
        make_compressor("8bit").decompress(torch.zeros(3, dtype=torch.uint8), 10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
@pytest.mark.parametrize("name", COMPRESSIONS)
def test_on_the_gpu(name: str) -> None:
    compressor = make_compressor(name, chunk=128)
    x = torch.randn(10_001, device="cuda")
    payload = compressor.compress(x)
    assert payload.device == x.device and payload.numel() == compressor.payload_size(x.numel())
    expected = compressor.decompress(compressor.compress(x.cpu()), x.numel())
    assert torch.allclose(compressor.decompress(payload, x.numel()).cpu(), expected, atol=1e-6)
