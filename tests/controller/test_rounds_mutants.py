"""Each round carries every rank's data position, pinned where mutation testing
(``bench/mutation.py``) showed the rounds tests let a bug through: a rank that reports no
position in a round (or has returned) keeps its last known one, so the checkpoint of any round
knows where every rank's data stream stood.
"""

from __future__ import annotations

from phalanx._internal.controller.rounds import Report, ReportRounds


def _report(index: int, position: dict | None = None) -> Report:  # type: ignore[type-arg]
    return Report(index, {"step": index}, None, float(index), data_position=position)


def test_a_round_carries_each_ranks_last_known_data_position() -> None:
    rounds = ReportRounds(world_size=2, start_round=0)
    rounds.add(0, _report(0, {"train": {"epoch": 0, "batch": 4}}))
    rounds.add(1, _report(0))  # no position with this report
    rounds.add(0, _report(1))
    rounds.add(1, _report(1, {"train": {"epoch": 0, "batch": 8}}))
    first, second = rounds.pop_complete(set())
    assert first.positions == [{"train": {"epoch": 0, "batch": 4}}, None]
    assert second.positions == [
        {"train": {"epoch": 0, "batch": 4}},  # rank 0 reported none: its last one stands
        {"train": {"epoch": 0, "batch": 8}},
    ]
