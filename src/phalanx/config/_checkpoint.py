"""CheckpointConfig: which checkpoints to keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from phalanx._foundation.keywords import KeywordChecked
from phalanx.config._checks import _fail, _is_int


@dataclass(frozen=True)
class CheckpointConfig(KeywordChecked):
    """Which checkpoints to keep.

    With ``checkpoint_score_attribute`` the ``num_to_keep`` best by that metric are kept (the
    latest is always kept until a newer one commits); without it, the newest ``num_to_keep``.
    ``checkpoint_frequency``/``checkpoint_at_end`` apply to trainers that own the loop (GBDT).

    Example::

        RunConfig(checkpoint_config=CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min",
        ))  # keep the 2 with the lowest loss
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (not _is_int(self.num_to_keep) or self.num_to_keep < 1):
            raise _fail(
                "CheckpointConfig", "num_to_keep", self.num_to_keep, "None or an integer >= 1"
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise _fail(
                "CheckpointConfig",
                "checkpoint_score_order",
                self.checkpoint_score_order,
                "'max' or 'min'",
            )
        attr = self.checkpoint_score_attribute
        if attr is not None and (not isinstance(attr, str) or not attr):
            raise _fail(
                "CheckpointConfig", "checkpoint_score_attribute", attr, "None or a metric name"
            )
        if not _is_int(self.checkpoint_frequency) or self.checkpoint_frequency < 0:
            raise _fail(
                "CheckpointConfig",
                "checkpoint_frequency",
                self.checkpoint_frequency,
                "an integer >= 0",
            )
        if self.checkpoint_at_end is not None and not isinstance(self.checkpoint_at_end, bool):
            raise _fail(
                "CheckpointConfig",
                "checkpoint_at_end",
                self.checkpoint_at_end,
                "None, True or False",
            )
