"""save_state / load_state: a whole training state checkpointed without stopping training.

``save_state`` turns modules and optimizers into state dicts through
``torch.distributed.checkpoint.state_dict`` (plain, DDP and FSDP2 modules alike: with FSDP each
rank holds only its shard), copies every tensor into a reused host snapshot (the only part that
blocks), and lets a background thread write the snapshot in DCP's format into a private
directory of the run. ``report(checkpoint=...)`` returns at once; the round commits when every
rank's files are written. ``load_state`` reads a checkpoint straight into the live objects with
``dcp.load``, resharding onto the current world size.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from phalanx._foundation import env
from phalanx._internal.storage.run_storage import STAGING_DIR
from phalanx._internal.worker import checkpoint_wait
from phalanx._internal.worker.session import Session, get_session, require_session
from phalanx._internal.worker.state_writer import StateWriter, WriteJob
from phalanx.checkpoint import Checkpoint
from phalanx.errors import ConfigError, SessionMisuseError
from phalanx.torch import _peer
from phalanx.torch._snapshot import BufferPool, take_snapshot

__all__ = ["load_state", "save_state"]

FORMATS = ("dcp", "safetensors")


def _dcp() -> Any:
    """``torch.distributed.checkpoint``, imported at first use: its import pulls in sympy (0.6 s
    on a laptop-class core, 3.5 s measured on an H200 host), which every worker importing
    ``phalanx.torch`` paid before its first line, whether it saved state or not."""
    import torch.distributed.checkpoint as dcp

    return dcp


def _state_dict_api() -> Any:
    """``torch.distributed.checkpoint.state_dict`` (imported at first use, as ``_dcp``)."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


class _TorchStateWriter(StateWriter):
    """The session's writer with its snapshot buffers and its own gloo group: DCP's collectives
    run on the write thread and must not share a group with the training loop's."""

    def __init__(self, slots: int, group: Any) -> None:
        super().__init__(slots)
        self.pools = [BufferPool() for _ in range(slots)]
        self.group = group
        self.count = 0


def save_state(
    state: dict[str, Any],
    *,
    blocking: bool = False,
    max_pending: int = 1,
    format: str = "dcp",
) -> Checkpoint:
    """Snapshot ``state`` and write it in the background; returns the checkpoint to report.

    ``state`` maps names to modules (plain, DDP or FSDP2), optimizers, LR schedulers (anything
    with ``state_dict``/``load_state_dict``), tensors and plain picklable values. Call it on
    every rank (DCP's planning is collective): a rank that does not call it within
    ``PHALANX_SAVE_STATE_TIMEOUT_S`` (300 s) fails the run with a
    :class:`~phalanx.errors.SessionMisuseError` naming it. It returns once the tensors are copied;
    ``report(metrics, checkpoint=...)`` then returns at once and the round commits when every
    rank's files are written. A write that fails fails the run. ``blocking=True`` returns
    once the files are written and makes that ``report()`` wait until the part is stored.
    ``max_pending`` snapshots may be held in memory; a further call waits for the oldest write.
    ``format="safetensors"`` writes each module's full state dict as ``<name>.safetensors``
    (rank 0; Hugging Face tools read it), for export.

    Example::

        state = {"model": model, "optimizer": opt, "scheduler": sched, "step": step}
        phalanx.report({"loss": loss}, checkpoint=phalanx.torch.save_state(state))
    """
    _check_arguments(state, max_pending, format)
    session = require_session("torch.save_state")
    started = time.perf_counter()
    try:
        return _save_state(session, state, blocking, max_pending, format)
    finally:  # the training thread was held: the goodput's checkpoint part
        checkpoint_wait.add(time.perf_counter() - started)


def _save_state(
    session: Session, state: dict[str, Any], blocking: bool, max_pending: int, format: str
) -> Checkpoint:
    if _distributed():
        previous = session.state_writer
        index = previous.count if isinstance(previous, _TorchStateWriter) else 0
        _roll_call("save_state", session.attempt, index)
    writer = _writer(session, max_pending)
    writer.raise_error()
    index = writer.count
    writer.slot(index)
    state_dict = _to_state_dict(state, full=format == "safetensors")
    if format == "dcp":
        _peer.watch(state, state_dict, _live_state)  # every report() keeps a copy (issue 44)
    snapshot = take_snapshot(state_dict, writer.pools[index % writer.slots])
    writer.count += 1
    path = _private_dir(session, index)
    write: Callable[[], None]
    if format == "safetensors":
        write = partial(_write_safetensors, snapshot, path)
    else:
        write = partial(_write_dcp, snapshot, _dcp_dir(path, session), writer.group)
    job = WriteJob(path, write, blocking)
    writer.submit(index, job)
    if blocking:
        job.result()
    return Checkpoint(path)


def load_state(checkpoint: Checkpoint, state: dict[str, Any]) -> None:
    """Load a ``save_state`` checkpoint into ``state``'s live objects, in place.

    Modules and optimizers are filled through ``set_state_dict`` (FSDP2 shards are resharded
    onto the current world size), tensors are copied into, other values are replaced in
    ``state``. Call it on every rank when training is distributed (``dcp.load`` is collective;
    a rank that does not call it within ``PHALANX_SAVE_STATE_TIMEOUT_S`` fails the run with a
    :class:`~phalanx.errors.SessionMisuseError` naming it).

    Example::

        if checkpoint := phalanx.get_checkpoint():
            phalanx.torch.load_state(checkpoint, state)
    """
    _check_arguments(state, 1, "dcp")
    if _distributed():
        session = get_session()
        attempt = session.attempt if session is not None else 0
        _load_calls[attempt] = _load_calls.get(attempt, -1) + 1
        _roll_call("load_state", attempt, _load_calls[attempt])
        if isinstance(checkpoint, _peer.PeerCheckpoint):
            _load_from_peers(checkpoint.offer, state)
            return
    with checkpoint.as_directory() as path:
        own = os.path.join(path, _rank_dir(_train_rank()))
        if not os.path.exists(os.path.join(path, ".metadata")) and os.path.isdir(own):
            path = own  # saved by ranks without a process group: each its own copy
        safetensors = [n for n in os.listdir(path) if n.endswith(".safetensors")]
        if safetensors and not os.path.exists(os.path.join(path, ".metadata")):
            _load_safetensors(path, state)
            return
        state_dict = _to_state_dict(state, full=False)
        if not _distributed():
            _quiet_single_process()
        _dcp().load(state_dict, checkpoint_id=path, no_dist=not _distributed())
    _apply(state, state_dict)
    _peer.watch(state, state_dict, _live_state)


def _load_from_peers(offer: _peer.Offer, state: dict[str, Any]) -> None:
    """Recovery to the failed step (``_peer``): the state of the offer's round, from this
    rank's own snapshot or from a surviving rank."""
    for value in state.values():  # what set_optimizer_state_dict does first, done before the
        if isinstance(value, torch.optim.Optimizer):  # hand-over: its state tensors receive too
            _state_dict_api()._init_optim_state(value)
    live = _live_state(state)  # its tensors are the destination (the parameters, in place)
    loaded = _peer.load_from_peers(offer, live)
    for key, value in state.items():
        got = loaded[key]
        if isinstance(value, torch.Tensor) and isinstance(got, torch.Tensor) and got is not value:
            with torch.no_grad():
                value.copy_(got)
    _apply(state, loaded)
    _peer.watch(state, _live_state(state), _live_state)


def _live_state(state: dict[str, Any]) -> dict[str, Any]:
    return _to_state_dict(state, full=False)


def _check_arguments(state: Any, max_pending: int, format: str) -> None:
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise TypeError(
            f"save_state/load_state take a dict from names to objects, got "
            f"{type(state).__name__}.\nHINT: pass e.g. {{'model': model, 'optimizer': opt}}."
        )
    if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
        raise ConfigError(
            f"save_state(max_pending={max_pending!r}) is invalid: it is how many snapshots "
            "may wait to be written, an int >= 1.\nHINT: leave the default, 1."
        )
    if format not in FORMATS:
        raise ConfigError(
            f"save_state(format={format!r}) is invalid: use 'dcp' (the whole state, sharded, "
            "the default) or 'safetensors' (a model-only export).\nHINT: format='dcp'."
        )


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _roll_call(api: str, attempt: int, index: int) -> None:
    """Every rank checks in for call ``index`` of ``api`` in the process group's store before
    any collective (the write's group, a full state dict's gather, DCP's planning and reads): a
    call on some ranks only fails naming the others instead of waiting in a collective for
    ever."""
    store = dist.distributed_c10d._get_default_store()
    rank = dist.get_rank()
    keys = [f"phalanx/{api}/{attempt}/{index}/{r}" for r in range(dist.get_world_size())]
    store.set(keys[rank], "1")
    timeout_s = env.save_state_timeout_s()
    deadline = time.monotonic() + timeout_s
    session = get_session()
    while True:  # in slices: a failure elsewhere ends the training call here (in-place recovery)
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=max(0.01, min(ROLL_CALL_SLICE_S, left))))
        except RuntimeError:  # DistStoreError: not every rank has checked in yet
            if session is not None:
                session._raise_if_interrupted()
            if time.monotonic() < deadline:
                continue
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
        else:
            missing = []
        break
    if not missing:
        if index > 0:  # every rank is past the previous roll call: its keys are not read again
            store.delete_key(f"phalanx/{api}/{attempt}/{index - 1}/{rank}")
        return
    raise SessionMisuseError(
        f"phalanx.torch.{api} was called (call #{index + 1}) on rank {rank}, but rank(s) "
        f"{missing} did not call it within {timeout_s:g} s. With a process group {api} is "
        f"collective ({_COLLECTIVE[api]}), so a call on some ranks only, such as inside "
        f"`if rank == 0:`, would wait for the others for ever.\nHINT: call {api} on every "
        f"rank, as often on each{_HINT[api]}; if a rank is only slow to get there, raise "
        f"{env.SAVE_STATE_TIMEOUT_VAR}."
    )


# A roll call waits for the other ranks in slices this long: a rank stuck there when another one
# died (it never comes) must end its training call when the attempt fails, or in-place recovery
# cannot keep its process (seen: killed after its step, before save_state at a checkpoint step)
ROLL_CALL_SLICE_S = 0.2

_COLLECTIVE = {
    "save_state": "the ranks plan one DCP checkpoint together, each writing its own part",
    "load_state": "the ranks read one DCP checkpoint together, each loading its own part",
}
_HINT = {
    "save_state": ", and pass each rank's checkpoint to its own report()",
    "load_state": " (each rank loads its own part, replicas included)",
}
_load_calls: dict[int, int] = {}  # load_state calls of this process by attempt


def _writer(session: Session, max_pending: int) -> _TorchStateWriter:
    writer = session.state_writer
    if isinstance(writer, _TorchStateWriter):
        if writer.slots != max_pending:  # resize once every snapshot in flight is written
            writer.wait_all()
            writer.slots = max_pending
            writer.pools = (writer.pools + [BufferPool() for _ in range(max_pending)])[:max_pending]
        return writer
    # every rank reaches its first save_state together, so the new group lines up
    group = dist.new_group(backend="gloo") if _distributed() else None
    writer = _TorchStateWriter(max_pending, group)
    session.state_writer = writer
    return writer


def _private_dir(session: Session, index: int) -> str:
    """Where this rank writes: inside the run's staging area (dropped by the driver with
    uncommitted parts) when storage is local, so the commit is a rename; a local temporary
    directory otherwise, uploaded by the commit."""
    storage = session.storage
    name = f"rank_{session.context.world_rank}_{index:06d}"
    if storage.local_path is not None:
        path = storage.path(STAGING_DIR, "state", f"attempt_{session.attempt}", name)
        os.makedirs(path, exist_ok=True)
        return path
    return tempfile.mkdtemp(prefix=f"phalanx-state-{name}-")


def _rank_dir(rank: int) -> str:
    return f"rank_{rank}"


def _train_rank() -> int:
    session = get_session()
    return session.context.world_rank if session is not None else 0


def _dcp_dir(path: str, session: Session) -> str:
    """Ranks of a run without a process group cannot plan one DCP checkpoint together: each
    writes a whole one of its own into ``rank_<r>/`` (the parts merge without a clash)."""
    if _distributed() or session.context.world_size == 1:
        return path
    own = os.path.join(path, _rank_dir(session.context.world_rank))
    os.makedirs(own, exist_ok=True)
    return own


def _optimizer_owner(
    key: str, optimizer: torch.optim.Optimizer, modules: dict[str, torch.nn.Module]
) -> torch.nn.Module:
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules.values():
        if params <= {id(p) for p in module.parameters()}:
            return module
    raise ValueError(
        f"state[{key!r}] is an optimizer whose parameters belong to no module in the state, "
        f"so its state cannot be keyed by parameter name (modules: {sorted(modules)}).\n"
        "HINT: put the model it optimizes in the same dict, e.g. {'model': model, "
        f"{key!r}: optimizer}}."
    )


def _to_state_dict(state: dict[str, Any], full: bool) -> dict[str, Any]:
    """Each entry as a state dict of tensors and plain values (the live tensors, not copies)."""
    modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
    api = _state_dict_api()
    options = api.StateDictOptions(full_state_dict=True, cpu_offload=True) if full else None
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            out[key] = api.get_model_state_dict(value, options=options)
        elif full:
            raise ValueError(
                f"save_state(format='safetensors') exports modules only; state[{key!r}] is a "
                f"{type(value).__name__}.\nHINT: pass {{'model': model}}, or use format='dcp' "
                "for the whole training state."
            )
        elif isinstance(value, torch.optim.Optimizer):
            owner = _optimizer_owner(key, value, modules)
            out[key] = api.get_optimizer_state_dict(owner, value)
        elif isinstance(value, torch.Tensor):
            out[key] = value
        elif callable(getattr(value, "state_dict", None)) and hasattr(value, "load_state_dict"):
            out[key] = value.state_dict()
        else:
            out[key] = value
    return out


def _apply(state: dict[str, Any], loaded: dict[str, Any]) -> None:
    api = _state_dict_api()
    modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            api.set_model_state_dict(value, loaded[key])
        elif isinstance(value, torch.optim.Optimizer):
            owner = _optimizer_owner(key, value, modules)
            api.set_optimizer_state_dict(owner, value, loaded[key])
        elif isinstance(value, torch.Tensor):
            pass  # dcp.load copied into it
        elif callable(getattr(value, "state_dict", None)) and hasattr(value, "load_state_dict"):
            value.load_state_dict(loaded[key])
        else:
            state[key] = loaded[key]


def _quiet_single_process() -> None:
    """DCP warns on every single-process save or load that it assumes one process; here that
    is the intent (one worker, or num_workers=0). A filter, not catch_warnings: that one is not
    thread-safe and the write runs beside the training thread."""
    warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING, category=UserWarning)


_SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


def _write_dcp(snapshot: dict[str, Any], path: str, group: Any) -> None:
    dcp = _dcp()
    writer = dcp.FileSystemWriter(path, single_file_per_rank=True, sync_files=True)
    if group is None:
        _quiet_single_process()
    dcp.save(snapshot, storage_writer=writer, process_group=group, no_dist=group is None)


def _write_safetensors(snapshot: dict[str, Any], path: str) -> None:
    from phalanx._foundation.optional import missing

    if error := missing("save_state(format='safetensors')", "safetensors", extra="torch"):
        raise error
    from safetensors.torch import save_file

    for key, tensors in snapshot.items():
        if tensors:  # empty on ranks other than 0: the full state dict is gathered there
            target = os.path.join(path, f"{key}.safetensors")
            save_file(tensors, target, metadata={"format": "pt"})
            with open(target, "rb") as f:
                os.fsync(f.fileno())


def _load_safetensors(path: str, state: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    api = _state_dict_api()
    for key, value in state.items():
        target = os.path.join(path, f"{key}.safetensors")
        if isinstance(value, torch.nn.Module) and os.path.exists(target):
            options = api.StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
            tensors: dict[str, Any] = load_file(target)
            api.set_model_state_dict(value, tensors, options=options)
