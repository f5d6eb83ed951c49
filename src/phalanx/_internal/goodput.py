"""``Result.goodput``: where a run's wall time went (computed by the controller, see
``_internal/controller/goodput.py``; kept in ``run.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PARTS", "Goodput"]

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

    Example::

        result = trainer.fit()
        print(result.goodput)                  # goodput 91.2 %: checkpoints 4.1 %, ...
        result.goodput.fractions["data"]       # 0.02: 2 % of the wall time waiting for data
    """

    wall_s: float
    seconds: dict[str, float]
    attempts: tuple[dict[str, float], ...] = ()

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
        """``goodput 91.2 %: checkpoints 4.1 %, data 2.0 %, ...`` (parts of 0.05 % or more)."""
        fractions = self.fractions
        shown = sorted(
            ((fractions.get(p, 0.0), name) for p, name in _SHOWN.items()),
            key=lambda pair: -pair[0],
        )
        rest = ", ".join(f"{name} {share * 100:.1f} %" for share, name in shown if share >= 5e-4)
        return f"goodput {self.goodput * 100:.1f} %" + (f": {rest}" if rest else "")

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as ``run.json`` keeps it."""
        return {
            "wall_s": self.wall_s,
            "seconds": dict(self.seconds),
            "fractions": self.fractions,
            "attempts": [dict(a) for a in self.attempts],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Goodput:
        return cls(
            float(data["wall_s"]),
            {str(k): float(v) for k, v in data["seconds"].items()},
            tuple({str(k): float(v) for k, v in a.items()} for a in data.get("attempts", ())),
        )
