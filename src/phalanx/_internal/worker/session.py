"""The worker-side session behind ``report``, ``get_context``, ``get_checkpoint``.

The driver calls :func:`init_session` on every worker before training, then
:func:`run_train_fn`. ``report()`` stages a checkpoint part (a copy of the user's directory, or
a rename when they allow their files to be moved; see ``uploader.py``) and queues the metrics to
the driver; it never waits for the driver.
"""

from __future__ import annotations

import dataclasses
import inspect
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from phalanx._internal.storage.checkpoint_class import class_name
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker import checkpoint_wait, data_wait
from phalanx._internal.worker.checkpoint_plan import (
    Background,
    CheckpointPlan,
    InPlace,
    Stage,
    StateJob,
    UserUpload,
    plan_checkpoint,
)
from phalanx._internal.worker.code_origins import load_function
from phalanx._internal.worker.data_position import DataPositions, Record, dataset_key
from phalanx._internal.worker.metrics import checked_metrics
from phalanx._internal.worker.profiling import ProfileWatch
from phalanx._internal.worker.report_checks import (
    check_checkpoint,
    check_upload_fn,
    check_validation,
    upload_mode,
)
from phalanx._internal.worker.report_extras import ReportExtras, Wire, plus_checkpoint_s
from phalanx._internal.worker.runtime import Outbox, current_outbox, outbox_is_thread_local
from phalanx._internal.worker.state_writer import StateWriter
from phalanx._internal.worker.step_anatomy import RankAnatomy
from phalanx._internal.worker.uploader import BackgroundUploader, in_place_dir_name, move_aside
from phalanx.checkpoint import Checkpoint, CheckpointUploadMode
from phalanx.context import PreemptionInfo, TrainContext
from phalanx.errors import SessionMisuseError

_process_session: Session | None = None
_local = threading.local()
thread_sessions: dict[int, Session] = {}  # thread engine: thread id -> its session


class PreemptionStop(BaseException):
    """Raised by ``report()`` at the stop round after a preemption notice; ends the attempt.

    A BaseException, so a training loop's ``except Exception`` does not swallow it.
    """


class AttemptInterrupted(BaseException):
    """Raised in a surviving Ray worker's training function (at its next ``report()``, or at
    once in Python code) when the attempt failed elsewhere and the worker is kept for the next.

    A BaseException, so a training loop's ``except Exception`` does not swallow it.
    """


@dataclass(frozen=True)
class SessionSpec:
    """What one worker needs to start a session (sent by the driver, one per rank)."""

    context: TrainContext
    storage: RunStorage
    checkpoint: Checkpoint | None
    start_round: int
    attempt: int
    dataset_shards: dict[str, Any] = field(default_factory=dict)
    has_validation: bool = False  # the trainer has a validation_config
    # The data positions stored with ``checkpoint`` (``data_position.read_record``), if any
    data_record: Record | None = None
    # (round, this rank's shards continuing after it): what a recovery to the failed step
    # (``phalanx.torch._peer``) reads instead of ``dataset_shards``; None: no such round
    peer_shards: tuple[int, dict[str, object]] | None = None


# Recovery to the failed step (issue 44, ``phalanx.torch._peer``): ``checkpoint_providers`` are
# asked once, at a session's first get_checkpoint() before its first report(), whether they offer
# another checkpoint to start from (None: they do not); ``report_hooks`` run at every report()
# with the round's index, before it is sent.
checkpoint_providers: list[Callable[[Session], Checkpoint | None]] = []
report_hooks: list[Callable[[Session, int], None]] = []


class Session:
    def __init__(self, spec: SessionSpec, outbox: Outbox) -> None:
        self.context = dataclasses.replace(spec.context, dataset_shards=spec.dataset_shards)
        self.storage = spec.storage
        self.attempt = spec.attempt
        self.next_round = spec.start_round
        self.collective_seq = 0  # phalanx.collective calls so far: calls match up by order
        self.latest_checkpoint = spec.checkpoint
        self.dataset_shards = spec.dataset_shards
        self.peer_shards = spec.peer_shards
        self.shards_taken = False  # get_dataset_shard() was called
        # Per session, not per process: on the thread engine every rank is a thread
        self.data_positions = _track_shards(DataPositions(spec.data_record), spec.dataset_shards)
        self.preemption: PreemptionInfo | None = None
        self.has_validation = spec.has_validation
        self._outbox = outbox
        self._uploader: BackgroundUploader | None = None
        self.last_checkpoint_round = -1  # the last round this rank passed a checkpoint in
        self.state_writer: StateWriter | None = None  # phalanx.torch.save_state's writes
        self.started: float | None = None  # when the training function started, until reported
        self.interrupted = False  # the attempt failed elsewhere: the next report() ends the call
        self.anatomy = RankAnatomy()  # collective waits, steps, replica checksums (prepare_model)
        # `phalanx profile`'s requests for a torch.profiler trace of this rank's next steps
        self.profile = ProfileWatch(self.storage.local_path, self.context.world_rank)
        self._ask_providers = True  # until the first get_checkpoint() or report()

    def current_checkpoint(self) -> Checkpoint | None:
        """What ``get_checkpoint()`` returns: the latest checkpoint, or what a provider offers
        instead at the start (``checkpoint_providers``)."""
        if self._ask_providers:
            self._ask_providers = False
            for provider in checkpoint_providers:
                offer = provider(self)
                if offer is not None:
                    self.latest_checkpoint = offer
                    break
        return self.latest_checkpoint

    def report(
        self,
        metrics: Mapping[str, object],
        checkpoint: Checkpoint | None = None,
        checkpoint_dir_name: str | None = None,
        checkpoint_upload_mode: CheckpointUploadMode | str = CheckpointUploadMode.SYNC,
        delete_local_checkpoint_after_upload: bool | None = None,
        checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
        validation: object = False,
    ) -> None:
        self._raise_if_interrupted()
        metrics = checked_metrics(metrics)  # numpy values become Python ones
        check_validation(validation, checkpoint, self.has_validation)
        mode = upload_mode(checkpoint_upload_mode)
        check_upload_fn(checkpoint_upload_fn, mode)
        if self._uploader is not None:
            self._uploader.raise_error()
        index = self.next_round
        check_checkpoint(checkpoint)
        plan: CheckpointPlan | None = None
        if checkpoint is not None:  # every check before the round is taken
            plan = plan_checkpoint(
                self.storage,
                checkpoint,
                mode,
                index,
                checkpoint_dir_name,
                delete_local_checkpoint_after_upload,
                checkpoint_upload_fn,
            )
        self._ask_providers = False
        for hook in report_hooks:
            hook(self, index)
        started = time.time()
        extras = _message_extras(validation, checkpoint)
        self._add_timings(extras)
        self.anatomy.add_to(extras, index, checkpoint is not None)
        self.profile.poll()
        self._add_position(extras)
        self.next_round += 1
        dir_name = None
        if checkpoint is None or plan is None:
            self._send(_report_message(index, metrics, None, started, extras))
        else:
            dir_name = self._persist(checkpoint, plan, index, metrics, started, extras)
        if dir_name is not None:
            self.last_checkpoint_round = index
            self.latest_checkpoint = Checkpoint(
                self.storage.checkpoint_path(dir_name), self.storage.filesystem
            )
        if self.preemption is not None and index >= self.preemption.stop_round:
            self.finish()
            raise PreemptionStop(
                f"rank {self.context.world_rank} stopped after round {index} (preemption of "
                f"rank(s) {list(self.preemption.preempted_ranks)})"
            )

    def _add_timings(self, extras: ReportExtras) -> None:
        """The goodput's numbers: the seconds this rank waited for batches since its last
        report and, in its first report of the attempt, when its training function started."""
        waited = data_wait.take()
        if waited:
            extras["data_wait_s"] = waited
        if blocked := checkpoint_wait.take():  # save_state's hold on this thread
            extras["checkpoint_s"] = blocked
        if self.started is not None:
            extras["started"], self.started = self.started, None

    def _add_position(self, extras: ReportExtras) -> None:
        """Where each data stream of this rank is after this round: stored with the round's
        checkpoint, if it has one (a few integers per stream; nothing without a stream)."""
        position = self.data_positions.snapshot()
        if position is not None:
            extras["data_position"] = position

    def _raise_if_interrupted(self) -> None:
        if self.interrupted:
            rank = self.context.world_rank
            raise AttemptInterrupted(f"rank {rank}: the attempt failed on another rank")

    def _persist(
        self,
        checkpoint: Checkpoint,
        plan: CheckpointPlan,
        index: int,
        metrics: Mapping[str, object],
        started: float,
        extras: ReportExtras,
    ) -> str:
        """Save this rank's part of the round as ``plan`` says, then send its report (once the
        part is durable); returns the name the round commits.

        The user's directory is only read, unless the plan moves it: then its files are moved
        (a rename on the same filesystem) and the directory removed once they are safe.
        """
        dir_name = plan.dir_name
        match plan:
            case InPlace():
                self.storage.mark_in_place(dir_name, self.attempt)
                self._send(_report_message(index, metrics, dir_name, started, extras))
            case StateJob(job=job):
                message = _report_message(index, metrics, dir_name, started, extras)
                self._background().upload(checkpoint, dir_name, message, True, prepare=job.result)
                if job.blocking:
                    self.finish_uploads()
            case Stage(move=move):
                if self._uploader is not None:
                    self._uploader.wait()  # the documented promise: the previous upload is done
                self.storage.stage_part(checkpoint, dir_name, self.attempt, move=move)
                saved = plus_checkpoint_s(extras, time.time() - started)
                self._send(_report_message(index, metrics, dir_name, started, saved))
            case Background(move_aside=aside):
                source = Checkpoint(move_aside(checkpoint)) if aside else checkpoint
                uploader = self._background()
                if waited := uploader.reserve():  # the previous upload was not done yet
                    extras = plus_checkpoint_s(extras, waited)
                message = _report_message(index, metrics, dir_name, started, extras)
                uploader.upload(source, dir_name, message, scratch=aside)
            case UserUpload():
                if self._uploader is not None:
                    self._uploader.wait()
                dir_name = self._upload_with(plan, checkpoint)
                saved = plus_checkpoint_s(extras, time.time() - started)
                self._send(_report_message(index, metrics, dir_name, started, saved))
        return dir_name

    def _upload_with(self, plan: UserUpload, checkpoint: Checkpoint) -> str:
        """``report(checkpoint_upload_fn=fn)``: ``fn(checkpoint, dir_name)`` persists the
        checkpoint itself (typically to ``get_storage().build_checkpoint_path_from_name(
        dir_name)``) and returns it. Returns the name the round commits: the returned
        checkpoint's own when it lies directly in the run directory (it joins like a NO_UPLOAD
        part); otherwise its files are copied in."""
        if plan.job is not None:
            plan.job.result()  # a save_state checkpoint: fn reads its files once they are written
        uploaded = plan.fn(checkpoint, plan.dir_name)
        if not isinstance(uploaded, Checkpoint):
            raise TypeError(
                f"checkpoint_upload_fn returned {type(uploaded).__name__}; it must return the "
                "phalanx.Checkpoint it persisted."
            )
        dir_name = plan.dir_name
        try:
            dir_name = in_place_dir_name(self.storage, uploaded, None)
            self.storage.mark_in_place(dir_name, self.attempt)
        except ValueError:  # persisted elsewhere: bring a copy into the run
            self.storage.stage_part(uploaded, dir_name, self.attempt)
        committed = self.storage.checkpoint_path(dir_name).rstrip("/")
        if plan.remove_after and checkpoint.path.rstrip("/") != committed:  # not the committed one
            shutil.rmtree(checkpoint.path, ignore_errors=True)
        return dir_name

    def nudge_driver(self, until_round: int | None = None) -> None:
        """An empty message: with num_workers=0 the driver handles events (finished
        validations too) only when one arrives. ``until_round``: ask the driver to record in the
        snapshot once every round before it is processed (rounds without a checkpoint write no
        snapshot of their own)."""
        self._outbox.send(("poll",) if until_round is None else ("poll", until_round))

    def finish_uploads(self) -> None:
        """Wait until every ASYNC checkpoint part of this rank is stored and reported."""
        if self._uploader is not None:
            self._uploader.wait()

    def _send(self, message: Wire) -> None:
        if self._uploader is not None and self._uploader.busy:
            self._uploader.send(message)  # keep the order behind pending uploads
        else:
            self._outbox.send(message)

    def _background(self) -> BackgroundUploader:
        if self._uploader is None:
            self._uploader = BackgroundUploader(self.storage, self.attempt, self._outbox)
        return self._uploader

    def finish(self) -> None:
        """Wait for pending uploads (and the reports behind them); raise an upload's error."""
        self.profile.close()
        try:
            if self._uploader is not None:
                try:
                    self._uploader.wait()
                finally:
                    self._uploader.close()
                    self._uploader = None
        finally:
            if self.state_writer is not None:
                writer, self.state_writer = self.state_writer, None
                writer.close()


def _track_shards(positions: DataPositions, shards: dict[str, Any]) -> DataPositions:
    """Every shard that knows its position (phalanx datasets) is tracked under its name; Ray
    Data's iterators and plain iterators are not."""
    for name, shard in shards.items():
        if callable(getattr(shard, "position_state", None)):
            positions.track(dataset_key(name), shard)
    return positions


def _message_extras(validation: object, checkpoint: Checkpoint | None) -> ReportExtras:
    """The report message's optional part: what to validate, and the checkpoint's class (the
    driver rebuilds ``result.checkpoint`` as that class, e.g. a ``TorchCheckpoint``)."""
    extras: ReportExtras = {}
    if validation:
        extras["validation"] = validation
    name = class_name(checkpoint) if checkpoint is not None else None
    if name is not None:
        extras["checkpoint_class"] = name
    return extras


def _report_message(
    index: int,
    metrics: Mapping[str, object],
    dir_name: str | None,
    started: float,
    extras: ReportExtras,
) -> Wire:
    """The report as the driver's ``messages.decode`` reads it (``extras`` only if any)."""
    message: Wire = ("report", index, metrics, dir_name, started)
    return (*message, extras) if extras else message


def init_session(spec: SessionSpec) -> None:
    global _process_session
    outbox = current_outbox()
    if outbox is None:  # pragma: no cover - the engines always install one
        raise RuntimeError("phalanx worker has no channel to the driver")
    session = Session(spec, outbox)
    if outbox_is_thread_local():
        _local.session = session
        thread_sessions[threading.get_ident()] = session
    else:
        _process_session = session


def clear_thread_session() -> None:
    """Forget the calling thread's session (after a run in the driver's thread ends)."""
    _local.session = None
    thread_sessions.pop(threading.get_ident(), None)


def get_session() -> Session | None:
    return getattr(_local, "session", None) or _process_session


def require_session(api: str) -> Session:
    session = get_session()
    if session is None:
        raise SessionMisuseError(
            f"phalanx.{api}() can only be called inside a training function run by a Trainer.\n"
            "HINT: call it from the train_loop_per_worker function you pass to the Trainer."
        )
    return session


def run_train_fn(
    payload: bytes | Callable[..., object],
    config: dict[str, Any] | None,
    context_factory: Callable[[], AbstractContextManager[object]],
) -> object:
    """Run the user's training function; only rank 0's return value is sent back."""
    fn = load_function(payload) if isinstance(payload, bytes) else payload
    session = get_session()
    if session is not None:
        session.started = time.time()  # the goodput's end of start-up, sent with the first report
    try:
        with context_factory():
            value = fn(config) if _takes_config(fn) else fn()
    finally:
        if session is not None:
            session.finish()  # the last checkpoints and reports reach the driver before we return
    return value if session is not None and session.context.world_rank == 0 else None


def _takes_config(fn: Callable[..., object]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind not in (p.VAR_KEYWORD,) for p in params)


def apply_preemption_notice(path: str | None) -> None:
    """Read the driver's preemption notice (JSON: stop_round, preempted_ranks, deadline)."""
    import json

    session = get_session()
    if session is None or path is None:
        return
    try:
        with open(path) as f:
            notice = json.load(f)
    except (OSError, ValueError):
        return
    session.preemption = PreemptionInfo(
        int(notice["stop_round"]), tuple(notice["preempted_ranks"]), float(notice["deadline"])
    )
