"""The ADPSGD pairing that the strategy, the simulator and the emulation share."""

from asrflow.parallel.topology import pairs, partner


def test_partners_are_mutual_and_alternate() -> None:
    for n in range(1, 20):
        for round_ in range(4):
            for rank in range(n):
                other = partner(rank, n, round_)
                assert other is None or (other != rank and partner(other, n, round_) == rank)
            alone = [r for r in range(n) if partner(r, n, round_) is None]
            assert len(alone) == (n % 2 if n > 1 else 1)
    assert [partner(r, 4, 0) for r in range(4)] == [1, 0, 3, 2]
    assert [partner(r, 4, 1) for r in range(4)] == [3, 2, 1, 0]
    assert [partner(r, 5, 1) for r in range(5)] == [None, 2, 1, 4, 3]
    assert [partner(r, 5, 0) for r in range(5)] == [1, 0, 3, 2, None]


def test_pairs_are_the_partners_of_a_round() -> None:
    assert pairs(0, 4) == [(0, 1), (2, 3)] and pairs(1, 4) == [(1, 2), (3, 0)]
    assert pairs(0, 3) == [(0, 1)] and pairs(1, 3) == [(1, 2)]  # odd n: one learner sits a round out
    assert pairs(0, 2) == pairs(1, 2) == [(0, 1)]
    assert pairs(5, 1) == []
    for n in range(2, 20):
        for round_ in range(3):
            mates = {r: m for pair in pairs(round_, n) for r, m in (pair, pair[::-1])}
            assert mates == {r: partner(r, n, round_) for r in range(n) if partner(r, n, round_) is not None}
