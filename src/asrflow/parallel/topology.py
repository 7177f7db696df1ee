"""Who exchanges with whom: the ADPSGD pairing, shared by the real strategy, the simulator and the emulation.

Kept free of torch so the discrete-event simulator can use it on its own.
"""

from __future__ import annotations


def partner(rank: int, count: int, round_: int) -> int | None:
    """The ring neighbour ``rank`` averages with in ``round_`` (None: it sits this round out).

    Even rounds pair (0,1), (2,3), …; odd rounds (1,2), (3,4), …, (count−1,0), so information
    travels both ways round the ring. With an odd ``count`` one learner has no partner: the
    last on even rounds, learner 0 on odd ones. Two learners always pair with each other.
    """
    if count < 2:
        return None
    if count == 2:
        return 1 - rank
    position = (rank - round_ % 2) % count
    if position == count - 1 and count % 2:  # odd count: the last of the cycle has no mate
        return None
    return (rank + 1 if position % 2 == 0 else rank - 1) % count


def pairs(round_: int, count: int) -> list[tuple[int, int]]:
    """Every pair of :func:`partner` in ``round_``, lower position in the round's cycle first."""
    if count == 2:
        return [(0, 1)]
    found: list[tuple[int, int]] = []
    seen: set[int] = set()
    for i in range(count):
        rank = (round_ % 2 + i) % count
        mate = partner(rank, count, round_)
        if rank not in seen and mate is not None:
            found.append((rank, mate))
            seen.update((rank, mate))
    return found
