"""``Result.goodput``: where a run's wall time went (computed by the controller, see
``_internal/controller/goodput.py``; kept in ``run.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PARTS", "Goodput", "format_bytes"]

PARTS = ("productive", "startup", "checkpoints", "data", "stragglers", "failures", "other")
_SHOWN = {  # the end-of-fit line's names, biggest first after "goodput"
    "checkpoints": "checkpoints",
    "data": "data",
    "stragglers": "stragglers",
    "failures": "failures",
    "startup": "start-up",
    "other": "other",
}


@dataclass(frozen=True)
class Goodput:
    """Where a run's wall time went: ``seconds`` per part (``PARTS``) for the whole run, and the
    same per attempt in ``attempts`` (oldest first); the parts add up to ``wall_s``.
    ``bytes_written``: the bytes of every checkpoint the run committed.

    Example::

        result = trainer.fit()
        print(result.goodput)                  # goodput 91.2 %: checkpoints 4.1 %, ...
        result.goodput.fractions["data"]       # 0.02: 2 % of the wall time waiting for data
    """

    wall_s: float
    seconds: dict[str, float]
    attempts: tuple[dict[str, float], ...] = ()
    bytes_written: int = 0

    @property
    def fractions(self) -> dict[str, float]:
        """Each part's share of the wall time (0.0 to 1.0)."""
        wall = self.wall_s or 1.0
        return {part: value / wall for part, value in self.seconds.items()}

    @property
    def goodput(self) -> float:
        """The productive share of the wall time (0.0 to 1.0)."""
        return self.fractions.get("productive", 0.0)

    def summary(self) -> str:
        """``goodput 91.2 %: checkpoints 4.1 %, data 2.0 %, ...`` (parts of 0.05 % or more),
        then ``; 1.2 GB of checkpoints written`` when the run committed any."""
        fractions = self.fractions
        shown = sorted(
            ((fractions.get(p, 0.0), name) for p, name in _SHOWN.items()),
            key=lambda pair: -pair[0],
        )
        rest = ", ".join(f"{name} {share * 100:.1f} %" for share, name in shown if share >= 5e-4)
        line = f"goodput {self.goodput * 100:.1f} %" + (f": {rest}" if rest else "")
        if self.bytes_written:
            line += f"; {format_bytes(self.bytes_written)} of checkpoints written"
        return line

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as ``run.json`` keeps it."""
        return {
            "wall_s": self.wall_s,
            "seconds": dict(self.seconds),
            "fractions": self.fractions,
            "attempts": [dict(a) for a in self.attempts],
            "bytes_written": self.bytes_written,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Goodput:
        return cls(
            float(data["wall_s"]),
            {str(k): float(v) for k, v in data["seconds"].items()},
            tuple({str(k): float(v) for k, v in a.items()} for a in data.get("attempts", ())),
            int(data.get("bytes_written", 0)),  # runs recorded before it was counted: 0
        )


def format_bytes(count: int) -> str:
    """``1536`` -> ``'1.5 kB'``: decimal units, as disks and object stores bill them.

    >>> format_bytes(999), format_bytes(1_234_567), format_bytes(3 * 10**12)
    ('999 B', '1.2 MB', '3.0 TB')
    """
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
