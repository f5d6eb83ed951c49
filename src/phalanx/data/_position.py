"""Where a split dataset's epoch stands, from every rank's position: exact, across world sizes.

Each rank's ``DataIterator`` counts the rows it has given out in the pass in progress (its
``position_state()``: the pass, its epoch, the rows consumed, whether it ended, the local
shuffle's seed). The driver built the shards, so it knows which positions of the epoch's order
each rank reads in each pass (``Assignment.positions``): ``combine`` turns the states of all
ranks at one round into a *record* of what is left of the epoch, as ranges of positions::

    {"version": 1, "epoch": 3, "num_rows": 120000, "consumed": 91200,
     "remaining": [[30400, 40000], [70400, 80000], ...], "later": [],
     "fingerprint": "9c1f03aa", "seed": 123}

(a long list of ranges, as a local shuffle leaves, is stored packed: see ``pack``).
``later`` holds what is left of the epochs after ``epoch`` that a rank had already started
(with ``equal_split=False`` a rank can run ahead by a batch). A rank that moved on to a later
pass, or whose pass ended, consumed its whole share of the earlier one (rows ``drop_last`` or
the equal split left out stay left out, as in a run that never failed); an epoch every rank
finished is complete, and the record names the next one. At a resume, ``resume_start`` turns
the record back into the first passes of the new shards: the remaining positions of each
unfinished epoch, split over the new world size.
"""

from __future__ import annotations

import base64
import logging
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from phalanx.data._batching import ShuffleKeys
from phalanx.data._plan import (
    Assignment,
    Ranges,
    Start,
    as_ranges,
    map_ranges,
    ranges_from_indices,
    ranges_len,
    subtract_ranges,
    take_ranges,
)

if TYPE_CHECKING:
    from phalanx.data._iterator import DataIterator
    from phalanx.data._source import Source

__all__ = [
    "DataPosition",
    "PassPosition",
    "combine",
    "describe",
    "fingerprint",
    "mixed_consumed",
    "pack",
    "progress",
    "resume_start",
    "unpack",
]

logger = logging.getLogger(__name__)

VERSION = 1
PACK_ABOVE = 64


@dataclass(frozen=True)
class DataPosition:
    """Where a rank is in its shard: ``epoch``, rows of it ``consumed`` (given out) and the
    ``rows`` of this rank's pass. Read as attributes or as a dict (``position["epoch"]``)."""

    epoch: int
    consumed: int
    rows: int

    def __getitem__(self, key: str) -> int:
        if key not in ("epoch", "consumed", "rows"):
            raise KeyError(key)
        return int(getattr(self, key))

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed, "rows": self.rows}


class PassPosition:
    """The pass in progress of one iterator; its reader adds each batch's rows to ``consumed``
    (one integer add per batch: the training thread reads it at every ``report()``). The add
    is ``batch_size`` even for a pass's shorter last batch, so ``consumed`` is read capped at
    ``rows``."""

    __slots__ = ("consumed", "done", "epoch", "index", "rows", "shuffle")

    def __init__(self, index: int, epoch: int, rows: int, shuffle: list[int] | None) -> None:
        self.index, self.epoch, self.rows, self.shuffle = index, epoch, rows, shuffle
        self.consumed = 0
        self.done = False

    def state(self) -> dict[str, Any]:
        return {
            "pass": self.index,
            "epoch": self.epoch,
            "consumed": min(self.consumed, self.rows),
            "done": self.done,
            "shuffle": self.shuffle,
        }


def fingerprint(source: Source) -> str:
    """Changes when the rows per fragment (files, row groups, blocks) change."""
    rows = np.ascontiguousarray(source.fragment_rows, dtype=np.int64)
    return f"{zlib.crc32(rows.tobytes()):08x}"


# -- the driver: combine the ranks' positions into a record ---------------------------------


def combine(shards: list[DataIterator], states: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The record of what is left of the epoch (see the module's docstring), from rank ``r``'s
    shard ``shards[r]`` (as the driver built it for the attempt) and its ``position_state()``
    at one round, ``states[r]`` (None: it had read nothing)."""
    if len(shards) != len(states):
        raise ValueError(f"combine: {len(shards)} shards but {len(states)} states.")
    mixed = getattr(shards[0], "combine_positions", None) if shards else None
    if mixed is not None:  # a Dataset.mix: one record per source (_mix.combine)
        return mixed(shards, states)  # type: ignore[no-any-return]
    first = shards[0]._assignment
    total = first.total if first.total is not None else shards[0]._source.num_rows
    ranks = [_state(_ended_if_read(s, st)) for s, st in zip(shards, states)]
    lo = min(r["pass"] for r in ranks)
    hi = max(max(r["pass"] + r["done"] for r in ranks), len(first.start.partial) - 1)
    epochs: list[tuple[int, Ranges]] = []
    for p in range(lo, hi + 1):
        if all(_finished(r, p) for r in ranks):
            continue
        consumed = [
            _consumed(s._assignment, s._source.num_rows, r, p) for s, r in zip(shards, ranks)
        ]
        base = first.start.partial[p] if p < len(first.start.partial) else _whole(total)
        epochs.append((p, subtract_ranges(base, np.concatenate(consumed))))
    while len(epochs) > 1 and epochs[-1][0] >= len(first.start.partial):
        if not np.array_equal(epochs[-1][1], _whole(total)):
            break
        epochs.pop()  # an epoch no rank started: the resumed run reaches it as usual
    p, remaining = epochs[0]
    return {
        "version": VERSION,
        "epoch": first.epoch_of(p),
        "num_rows": total,
        "consumed": total - ranges_len(remaining),
        "remaining": pack(remaining),
        "later": [pack(rest) for _, rest in epochs[1:]],
        "fingerprint": first.fingerprint,
        "seed": first.seed,
    }


def _ended_if_read(shard: DataIterator, state: dict[str, Any] | None) -> dict[str, Any] | None:
    """A pass whose every row was given out has ended, though the loop over it has not reached
    StopIteration (``report()`` after the last batch, inside the loop). A checkpoint taken there
    resumes at the next epoch, as ``start_epoch = checkpoint_epoch + 1`` loops (Ray's docs) and
    frameworks that count epochs themselves (Hugging Face, Lightning) expect, not with an empty
    first pass."""
    if state is None or state.get("done"):
        return state
    rows = ranges_len(shard._assignment.positions(shard._source.num_rows, int(state["pass"])))
    return {**state, "done": True} if int(state["consumed"]) >= rows else state


def _state(state: dict[str, Any] | None) -> dict[str, Any]:
    if state is None:
        return {"pass": 0, "epoch": None, "consumed": 0, "done": False, "shuffle": None}
    return {
        "pass": int(state["pass"]),
        "epoch": state.get("epoch"),
        "consumed": int(state["consumed"]),
        "done": bool(state.get("done")),
        "shuffle": state.get("shuffle"),
    }


def _finished(rank: dict[str, Any], p: int) -> bool:
    return bool(rank["pass"] > p or (rank["pass"] == p and rank["done"]))


def _whole(total: int) -> Ranges:
    return as_ranges([(0, total)] if total else [])


def _consumed(a: Assignment, source_rows: int, rank: dict[str, Any], p: int) -> Ranges:
    """The positions of pass ``p`` this rank consumed."""
    if rank["pass"] < p:
        return as_ranges([])
    mine = a.positions(source_rows, p)
    if _finished(rank, p):
        return mine
    if not rank["shuffle"]:
        return take_ranges(mine, 0, rank["consumed"])
    keys = ShuffleKeys.from_state(rank["shuffle"], a.epoch_of(p))
    lo, chosen = keys.first(ranges_len(mine), rank["consumed"])
    items = np.concatenate([as_ranges([(0, lo)] if lo else []), ranges_from_indices(chosen)])
    return map_ranges(mine, items)


# -- a resume: the record back into the new shards' first passes ----------------------------


def resume_start(
    record: dict[str, Any], name: str, source: Source, seed: int | None
) -> tuple[Start, int | None]:
    """The ``Start`` of the shards of dataset ``name`` resumed from ``record``, and the file
    order seed to use (the record's when the dataset's own is None, i.e. drawn). A record that
    does not match the data (rows, fragments or seed changed): one warning, and its epoch
    starts over."""
    epoch = int(record.get("epoch", 0))
    stored_seed = record.get("seed")
    changed = _mismatch(record, source, seed)
    use_seed = seed if seed is not None else stored_seed
    if changed:
        logger.warning(
            "Dataset %r: the data position stored with the checkpoint does not match the data "
            "(%s), so epoch %d starts over instead of continuing where the checkpoint was "
            "taken.\nHINT: resume with the same data (files, rows, seed) to continue the "
            "epoch exactly; DataConfig(resume_position=False) starts each attempt at epoch 0 "
            "without this check.",
            name,
            changed,
            epoch,
        )
        return Start(epoch), use_seed
    partial = tuple(unpack(r) for r in [record["remaining"], *record.get("later", [])])
    if len(partial) == 1 and np.array_equal(partial[0], _whole(source.num_rows)):
        partial = ()  # nothing of the epoch consumed: a plain epoch
    return Start(epoch, partial), use_seed


def _mismatch(record: dict[str, Any], source: Source, seed: int | None) -> str:
    if record.get("version") != VERSION:
        return f"it is of format {record.get('version')!r}, this phalanx reads {VERSION}"
    if int(record.get("num_rows", -1)) != source.num_rows:
        return f"it counted {record.get('num_rows')} rows, the data now has {source.num_rows}"
    if record.get("fingerprint") != fingerprint(source):
        return "the rows per file, row group or block changed"
    stored = record.get("seed")
    if seed is not None and stored is not None and seed != stored:
        return f"it was read in the order of seed {stored}, the dataset now has seed {seed}"
    return ""


def pack(ranges: Ranges) -> list[list[int]] | str:
    """Ranges for a record: a list of ``[start, stop]`` when short; else (a local shuffle
    leaves thousands) a string ``"z:"`` + base64 of the zlib-compressed differences between
    consecutive bounds, about 1/10 of the list's size."""
    if len(ranges) <= PACK_ABOVE:
        return [[int(a), int(b)] for a, b in ranges.tolist()]
    bounds = ranges.ravel()
    steps = np.diff(bounds, prepend=0).astype("<i8")
    return "z:" + base64.b64encode(zlib.compress(steps.tobytes(), 1)).decode("ascii")


def unpack(value: list[list[int]] | str) -> Ranges:
    """The ranges ``pack`` wrote."""
    if isinstance(value, str):
        if not value.startswith("z:"):
            raise ValueError(f"A data position's ranges start {value[:8]!r}, not 'z:'.")
        steps = np.frombuffer(zlib.decompress(base64.b64decode(value[2:])), dtype="<i8")
        return np.cumsum(steps).reshape(-1, 2)
    return as_ranges(value)


# -- for people ------------------------------------------------------------------------------


def describe(record: dict[str, Any]) -> str:
    """Where a record resumes, e.g. ``"epoch 3, sample 91,200 of 120,000"`` (the samples of
    the epoch consumed by all ranks, of the epoch's size)."""
    if "mix" in record:
        return _describe_mixed(record)
    text = f"epoch {record['epoch']}, sample {record['consumed']:,} of {record['num_rows']:,}"
    later = record.get("later") or []
    if later:
        total = int(record["num_rows"])
        epoch = int(record["epoch"])
        ahead = [
            f"{total - ranges_len(unpack(r)):,} of epoch {epoch + 1 + i}"
            for i, r in enumerate(later)
        ]
        text += f" (and {', '.join(ahead)})"
    return text


def progress(record: dict[str, Any]) -> str:
    """A short form for progress lines: ``"epoch 3 76%"``."""
    if "mix" in record:
        return _progress_mixed(record)
    total = int(record["num_rows"])
    share = int(record["consumed"]) / total if total else 1.0
    return f"epoch {record['epoch']} {share:.0%}"


# -- a mixed dataset's record (Dataset.mix: one record per source under "mix") ----------


def mixed_consumed(record: dict[str, Any], records: list[dict[str, Any]]) -> int:
    """Rows of the mixed epoch's source consumed (a source ahead: all of it)."""
    epoch = min(int(r["epoch"]) for r in records)
    return int(record["num_rows"]) if int(record["epoch"]) > epoch else int(record["consumed"])


def _describe_mixed(record: dict[str, Any]) -> str:
    """E.g. ``"epoch 2, source 0 900 of 1,000, source 1 120 of 400"``."""
    records = record["mix"]
    each = ", ".join(
        f"source {i} {mixed_consumed(r, records):,} of {int(r['num_rows']):,}"
        for i, r in enumerate(records)
    )
    return f"epoch {record['epoch']}, {each}"


def _progress_mixed(record: dict[str, Any]) -> str:
    """E.g. ``"epoch 2 [90% 30%]"``: each source's share of its rows consumed."""
    records = record["mix"]
    shares = []
    for r in records:
        total = int(r["num_rows"])
        shares.append(f"{mixed_consumed(r, records) / total if total else 1.0:.0%}")
    return f"epoch {record['epoch']} [{' '.join(shares)}]"
