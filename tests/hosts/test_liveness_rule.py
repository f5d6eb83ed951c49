"""The per-host liveness rule (engines/ray/liveness.py) on a clock of its own: a host is lost
when every worker on it that answered once is silent past the bound; the bound adapts to the
gaps between answers within [floor, cap]; the poller's own stalls and the driver's own address
never count."""

from __future__ import annotations

import pytest

from phalanx._foundation import env
from phalanx._internal.engines.ray.liveness import FLOOR_S, Followed, HostLiveness

A, B, DRIVER = "10.0.0.11", "10.0.0.12", "10.0.0.10"


def workers() -> list[Followed]:
    return [
        Followed("w0", 0, A, "node-a"),
        Followed("w1", 1, A, "node-a"),
        Followed("w2", 2, B, "node-b"),
        Followed("w3", 3, DRIVER, "node-d"),
        Followed("w4", 4, "", "?"),  # no hello yet
    ]


def answer_all(liveness: HostLiveness, now: float, skip: tuple[str, ...] = ()) -> None:
    for w in workers():
        if w.worker not in skip:
            liveness.heard(w.worker, w.host, now)


def test_a_host_is_lost_once_all_its_workers_are_silent_past_the_bound() -> None:
    liveness = HostLiveness(3.0, local_host=DRIVER)
    assert liveness.bound_s() == 3.0  # too few samples: the cap
    now = 0.0
    for _ in range(30):  # answers every 0.5 s (an idle drain): gaps of 0.5 s
        liveness.tick(now, 0.5)
        answer_all(liveness, now)
        now += 0.5
    assert liveness.bound_s() == FLOOR_S  # 3 x p99 = 1.5 s, below the floor
    # host A's rank 0 keeps answering: A is not silent even though rank 1 is
    for t in (now + 0.5 * i for i in range(7)):
        liveness.tick(t, 0.5)
        answer_all(liveness, t, skip=("w1", "w2", "w3"))
    lost = liveness.silent_hosts(workers(), now + 3.0)
    assert [(h.host, h.ranks) for h in lost] == [(B, (2,))]  # never the driver's own host
    assert lost[0].silent_s == pytest.approx(3.5) and lost[0].bound_s == FLOOR_S
    assert lost[0].describe() == f"host {B}: no answer from rank 2 for 3.5 s"


def test_the_bound_adapts_to_slow_answers_and_is_capped() -> None:
    loaded = HostLiveness(3.0)
    for i in range(40):
        loaded.heard("w", A, 0.9 * i)  # a loaded machine: gaps of 0.9 s
    assert loaded.bound_s() == pytest.approx(2.7)  # 3 x p99, above the floor
    slower = HostLiveness(3.0)
    for i in range(40):
        slower.heard("w", A, 1.2 * i)
    assert slower.bound_s() == 3.0  # 3.6 s: capped
    assert HostLiveness(1.0).floor_s == 1.0  # a cap below the floor lowers the floor


def test_a_stalled_poller_and_a_silence_below_the_bound_cost_nothing() -> None:
    liveness = HostLiveness(3.0)
    for w in workers()[:3]:
        liveness.heard(w.worker, w.host, 0.0)
    liveness.tick(0.0, 0.05)
    liveness.tick(5.0, 0.05)  # the poller itself did not look for 5 s
    assert liveness.silent_hosts(workers(), 5.0) == []
    assert liveness.silent_hosts(workers(), 5.0 + 2.9) == []  # a blip: below the bound
    lost = {h.host: h for h in liveness.silent_hosts(workers(), 5.0 + 3.0)}
    assert set(lost) == {A, B}
    assert lost[A].describe() == f"host {A}: no answer from ranks 0, 1 for 3.0 s"
    liveness.forget("w2")  # a worker forgotten (stopped) is not judged
    assert {h.host for h in liveness.silent_hosts(workers(), 9.0)} == {A}


def test_host_silent_s_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PHALANX_HOST_SILENT_S", raising=False)
    assert env.host_silent_s() == 3.0
    monkeypatch.setenv("PHALANX_HOST_SILENT_S", "1.5")
    assert env.host_silent_s() == 1.5
    monkeypatch.setenv("PHALANX_HOST_SILENT_S", "soon")
    with pytest.raises(ValueError, match="HINT: set it to a number of seconds"):
        env.host_silent_s()
