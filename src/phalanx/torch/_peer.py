"""Recovery to the failed step: the survivors of a failed attempt hand their state to the ranks
that replace the lost ones, instead of every rank going back to the last committed checkpoint.

Once a training function has named its state (its first ``save_state``, or a ``load_state``),
every ``report()`` copies that state into one of two reused host snapshots of this process,
tagged with the round (the attempt and the report's index) and the rank's data positions. A
survivor of in-place recovery keeps its process, so its snapshots outlive the failed attempt.

In the next attempt, every rank agrees as its training function starts (TorchBackend's
``TrainFuncContext``), through the re-formed process group's store, on an *offer*: the newest
round that every survivor holds a snapshot of (every rank completed it; at most the step that
failed is trained again). The first ``get_checkpoint()`` returns a :class:`PeerCheckpoint`
(the committed checkpoint's path, if any, plus the offer);
``load_state`` with it restores a survivor from its own snapshot and hands the state from one
survivor to the new ranks, into their live tensors (``_handover``: shared memory on one host,
else a gloo group of their own). The data positions of that round go with it: each
prepared DataLoader continues where the round left it; a phalanx dataset's shards are planned
by the driver, which also plans, from its last complete round (every rank reported it), the
shards that continue there (``SessionSpec.peer_shards``): the offer is then that round, and
the session reads those shards instead of the checkpoint's.

No offer (the state is restored from the committed checkpoint, as before) when: no rank
survived, the loop never named a state, the state is sharded (FSDP2 DTensors: a lost rank's
shard exists nowhere else), the run reads an iterable DataLoader, or a phalanx dataset whose
position at the driver's last complete round is unknown or no longer held by a survivor, a
DataLoader was prepared or a dataset shard taken before ``get_checkpoint()``, or the previous
offer's attempt failed before its first ``report()`` (a second failure during the hand-over).
Nothing of a peer state is ever written as a checkpoint.
"""

from __future__ import annotations

import copy
import json
import logging
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import torch.distributed as dist

from phalanx._foundation import env
from phalanx._internal.worker import session as session_module
from phalanx._internal.worker.data_position import DATASET_PREFIX, Tracked, dataset_key
from phalanx._internal.worker.session import Session
from phalanx.checkpoint import Checkpoint
from phalanx.torch import _handover
from phalanx.torch._handover import HandOver, SharedPool, any_of, last_hand_over
from phalanx.torch._snapshot import BufferPool, _dtensor_class, take_snapshot

logger = logging.getLogger(__name__)

OFFER_TIMEOUT_S = 30.0  # how long a rank waits for the others' answers at get_checkpoint()
SLOTS = 2  # survivors may be one report apart: the newer and the one before


@dataclass
class _Slot:
    pool: BufferPool = field(default_factory=SharedPool)  # a receiver on this host maps it
    tag: tuple[int, int] | None = None  # (attempt, round index); None while being written
    snapshot: dict[str, Any] | None = None
    positions: dict[str, dict[str, Any]] | None = None


@dataclass(frozen=True)
class Offer:
    """What every rank agreed on: restore round ``tag`` held by ``survivors``; ``source``
    sends it to the others; the data positions' records at that round."""

    tag: tuple[int, int]
    source: int
    survivors: tuple[int, ...]
    world_size: int
    data_record: dict[str, Any]


class PeerCheckpoint(Checkpoint):
    """``get_checkpoint()``'s answer when the survivors hold a newer state than the committed
    checkpoint: pass it to ``phalanx.torch.load_state``. Its path is the committed checkpoint's
    (an empty directory when none was committed yet); the state it restores is in memory only."""

    def __init__(self, path: str, filesystem: Any, offer: Offer) -> None:
        super().__init__(path, filesystem)
        self.offer = offer


class _Keeper:
    """This process's snapshots and the state they copy (one training function at a time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots = [_Slot() for _ in range(SLOTS)]
        self.state: dict[str, Any] | None = None  # the live state named by the function
        self.session: Session | None = None  # whose reports snapshot it
        self.refused: str | None = None  # why this state cannot be handed over
        self.pending_offer: tuple[int, int] | None = None  # offered, not yet past a report
        self.failed = False  # a snapshot failed once: no more of them
        self.to_state_dict: Any = None  # _state's: the live state dict of ``state``
        self.offer: tuple[Session, Offer] | None = None  # agreed at the function's start

    def watch(self, session: Session, state: dict[str, Any], state_dict: dict[str, Any]) -> None:
        if self.session is session and self.state is state:
            return
        self.session, self.state = session, state
        self.refused = _sharded(state_dict)
        if self.refused is not None:
            self.drop()
            if session.context.world_rank == 0:
                logger.info(
                    "Recovery to the failed step is off for this run: %s; after a failure the "
                    "run resumes from the last committed checkpoint.",
                    self.refused,
                )

    def drop(self) -> None:
        for slot in self.slots:
            slot.tag, slot.snapshot, slot.positions = None, None, None

    def held(self) -> list[tuple[int, int]]:
        return [slot.tag for slot in self.slots if slot.tag is not None]

    def slot_of(self, tag: tuple[int, int]) -> _Slot | None:
        return next((s for s in self.slots if s.tag == tag), None)


_keeper = _Keeper()


def watch(state: dict[str, Any], state_dict: dict[str, Any], to_state_dict: Any) -> None:
    """``save_state``/``load_state`` named ``state`` (``state_dict``: its live state dict, as
    ``to_state_dict(state)`` makes it at every report)."""
    current = session_module.get_session()
    if current is None or current.context.world_size < 2 or not env.peer_recovery():
        return
    if dist.is_available() and dist.is_initialized():  # one rank per process, a torch group
        _keeper.to_state_dict = to_state_dict
        _keeper.watch(current, state, state_dict)


def _sharded(state_dict: dict[str, Any]) -> str | None:
    dtensor = _dtensor_class()
    if dtensor is not None and any_of(state_dict, lambda v: isinstance(v, dtensor)):
        return "the state is sharded (FSDP DTensors): a lost rank's shard exists only on it"
    return None


# -- every report(): the snapshot ------------------------------------------------------------------


def _on_report(session: Session, index: int) -> None:
    keeper = _keeper
    if keeper.pending_offer is not None:  # the restarted function got past its first step
        keeper.pending_offer = None
    if keeper.session is not session or keeper.state is None or keeper.refused or keeper.failed:
        return
    slot = min(keeper.slots, key=lambda s: (s.tag is not None, s.tag or (0, 0)))
    with keeper.lock:
        slot.tag = None  # half-written until tagged (an interrupt may land inside the copy)
        try:
            slot.snapshot = None
            if isinstance(slot.pool, SharedPool):
                slot.pool.compact()
            slot.snapshot = take_snapshot(keeper.to_state_dict(keeper.state), slot.pool)
            slot.positions = copy.deepcopy(session.data_positions.snapshot())
        except Exception:
            keeper.failed = True
            keeper.drop()
            logger.warning(
                "Recovery to the failed step is off for this function: its state could not be "
                "copied at report()",
                exc_info=True,
            )
            return
        slot.tag = (session.attempt, index)


# -- the first get_checkpoint() of a restarted attempt: the offer ----------------------------------


def agree_at_start() -> None:
    """Every rank of a restarted attempt, as its training function starts (TorchBackend's
    ``TrainFuncContext``, so every rank takes part whatever the loop does): tell the others
    which rounds this process holds, and agree on the offer ``get_checkpoint()`` returns."""
    session = session_module.get_session()
    keeper = _keeper
    keeper.offer = None
    if session is None or session.context.world_size < 2:
        return
    if session.attempt == 0 or not env.peer_recovery():
        keeper.drop()
        return
    if not (dist.is_available() and dist.is_initialized()):
        return
    rank, world = session.context.world_rank, session.context.world_size
    answer = _answer(session, keeper)
    store = dist.distributed_c10d._get_default_store()
    keys = [f"phalanx/peer/{session.attempt}/{r}" for r in range(world)]
    store.set(keys[rank], json.dumps(answer))
    try:
        store.wait(keys, timedelta(seconds=OFFER_TIMEOUT_S))
        complete = True
    except RuntimeError:  # DistStoreError: some rank did not start in time
        complete = False
    # One decision for all: the first rank to see every answer, or to give up waiting, sets
    # it; a rank arriving after one gave up must not go on alone.
    decision = f"phalanx/peer/{session.attempt}/decision"
    if store.compare_set(decision, "", "go" if complete else "abandon").decode() != "go":
        keeper.drop()
        keeper.pending_offer = None
        logger.warning(
            "Recovery to the failed step: not every rank started its training function within "
            "%g s of the others; resuming from the last committed checkpoint.",
            OFFER_TIMEOUT_S,
        )
        return
    answers = [json.loads(store.get(key)) for key in keys]
    offer, why = _agree(answers, world)
    keeper.pending_offer = None
    if offer is None:
        if why and rank == 0:
            logger.warning(
                "Recovery to the failed step is not possible: %s. The run resumes from the last "
                "committed checkpoint.",
                why,
            )
        keeper.drop()  # nothing held now matches the committed state the ranks go back to
        return
    keeper.offer = (session, offer)


def _provide(session: Session) -> Checkpoint | None:
    """``get_checkpoint()``'s first call before a report: the agreed offer, if any."""
    keeper = _keeper
    if keeper.offer is None or keeper.offer[0] is not session:
        return None
    offer = keeper.offer[1]
    keeper.offer = None
    rank, world = session.context.world_rank, session.context.world_size
    if session.data_positions._loaders:  # the same on every rank: they run the same code
        keeper.drop()
        if rank == 0:
            logger.warning(
                "Recovery to the failed step is not possible: a DataLoader was prepared before "
                "get_checkpoint(), so it could not continue from the recovered step. The run "
                "resumes from the last committed checkpoint.\nHINT: call get_checkpoint() "
                "before prepare_data_loader()."
            )
        return None
    if not _follow_the_shards(session):
        keeper.drop()
        return None
    keeper.pending_offer = offer.tag
    if rank == 0:
        logger.warning(
            "Recovery to the failed step: rank(s) %s hold the state of round %d of attempt %d; "
            "rank %d sends it to rank(s) %s (not from storage).",
            list(offer.survivors),
            offer.tag[1],
            offer.tag[0],
            offer.source,
            [r for r in range(world) if r not in offer.survivors],
        )
    session.data_positions._resume.update(offer.data_record)
    # The next report is the round after the recovered one: its metrics row and default
    # checkpoint name follow the failed attempt's rows (the driver numbers rounds from it)
    session.next_round = offer.tag[1] + 1
    committed = session.latest_checkpoint
    if committed is not None:
        return PeerCheckpoint(committed.path, committed.filesystem, offer)
    return PeerCheckpoint(tempfile.mkdtemp(prefix="phalanx-peer-"), None, offer)


def _follow_the_shards(session: Session) -> bool:
    """Switch the session to the dataset shards that continue after the offered round (the
    driver planned them), unless a shard was already taken (False: resume from storage)."""
    peer = session.peer_shards
    if peer is None or peer[1] is session.dataset_shards:
        return True
    if session.shards_taken:  # the same on every rank: they run the same code
        if session.context.world_rank == 0:
            logger.warning(
                "Recovery to the failed step is not possible: get_dataset_shard() was called "
                "before get_checkpoint(), so its shard could not continue from the recovered "
                "step. The run resumes from the last committed checkpoint.\nHINT: call "
                "get_checkpoint() before get_dataset_shard()."
            )
        return False
    session.dataset_shards.update(peer[1])  # the context holds the same dict
    for name, shard in peer[1].items():
        if callable(getattr(shard, "position_state", None)):
            session.data_positions.track(dataset_key(name), cast(Tracked, shard))
    return True


def _answer(session: Session, keeper: _Keeper) -> dict[str, Any]:
    """What this rank tells the others: the rounds it holds and their positions, or why the
    run cannot recover to the failed step."""
    refused = keeper.refused
    if keeper.pending_offer is not None:
        refused = "the attempt that received the last hand-over failed before its first step"
    elif session.dataset_shards and session.peer_shards is None:
        refused = (
            "the run reads a dataset whose position at the last step every rank completed is "
            "unknown to the driver, so its shards restart from the checkpoint"
        )
    tags = sorted(keeper.held())
    if refused is None and session.dataset_shards and session.peer_shards is not None:
        planned = session.peer_shards[0]  # the round the driver planned the shards after
        if tags and not (tags := [t for t in tags if t[1] == planned]):
            refused = f"it no longer holds round {planned}, which the driver planned the data for"
    if refused is not None:
        keeper.drop()
        return {"refused": refused, "held": []}
    held = []
    for tag in tags:
        slot = keeper.slot_of(tag)
        assert slot is not None
        positions = {  # a dataset's: the driver's (peer_shards)
            k: v for k, v in (slot.positions or {}).items() if not k.startswith(DATASET_PREFIX)
        }
        if any(s.get("kind") != "map" for s in positions.values()):
            keeper.drop()  # an iterable loader's state is its own rank's only
            return {"refused": "an iterable DataLoader's position is its rank's own", "held": []}
        held.append({"tag": list(tag), "positions": positions})
    return {"refused": None, "held": held}


def _agree(answers: list[dict[str, Any]], world: int) -> tuple[Offer | None, str | None]:
    """The offer every rank computes alike from every rank's answer (None: why, if worth
    saying)."""
    for rank, answer in enumerate(answers):
        if answer["refused"]:
            return None, f"rank {rank}: {answer['refused']}"
    held = {r: {tuple(h["tag"]): h["positions"] for h in a["held"]} for r, a in enumerate(answers)}
    survivors = tuple(r for r in range(world) if held[r])
    if not survivors:
        return None, None  # nobody holds a state: a fresh group, or a loop without save_state
    common = set.intersection(*(set(held[r]) for r in survivors))
    if not common:
        return None, "the surviving ranks hold no state of the same round"
    tag = max(common)
    source = survivors[0]
    record: dict[str, Any] = {}
    for key in held[source][tag]:
        states = []
        for r in range(world):
            own = held[r].get(tag, {}).get(key) if r in survivors else None
            states.append(own if own is not None else {**held[source][tag][key], "rank": r})
        record[key] = {"world_size": world, "ranks": states}
    return Offer((int(tag[0]), int(tag[1])), source, survivors, world, record), None


# -- load_state(PeerCheckpoint): the hand-over (its transport: _handover) -------------------------


def load_from_peers(offer: Offer, live: dict[str, object]) -> dict[str, object]:
    """The state of round ``offer.tag`` as a state dict for ``_apply``, its tensors written into
    the live state dict ``live``'s where they match: from this rank's own snapshot on a
    survivor, received from ``offer.source`` on the others."""
    started = time.perf_counter()
    rank = dist.get_rank()
    receivers = [r for r in range(offer.world_size) if r not in offer.survivors]
    # every rank makes the group (new_group is collective), only its members use it
    group = dist.new_group(ranks=[offer.source, *receivers], backend="gloo")
    moved = HandOver()
    try:
        if rank in offer.survivors:
            slot = _keeper.slot_of(offer.tag)
            if slot is None or slot.snapshot is None:
                raise RuntimeError(f"rank {rank} no longer holds round {offer.tag}")
            if rank == offer.source:
                moved = _handover.send(slot.snapshot, slot.pool, offer.source, group)
            loaded = _handover.restore_own(slot.snapshot, live)
        else:
            loaded, moved = _handover.receive(offer.source, group, live)
    finally:
        dist.destroy_process_group(group)
    last_hand_over.bytes, last_hand_over.transport = moved.bytes, moved.transport
    last_hand_over.seconds = time.perf_counter() - started
    if rank == offer.source and receivers:
        logger.info(
            "Recovery to the failed step: sent %.1f MB to rank(s) %s in %.3f s (%s)",
            moved.bytes / 1e6,
            receivers,
            last_hand_over.seconds,
            moved.transport,
        )
    return loaded


session_module.checkpoint_providers.append(_provide)
session_module.report_hooks.append(_on_report)
