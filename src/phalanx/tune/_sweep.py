"""The sweep's driver: trials in threads, the searcher and scheduler deciding under one lock,
and the sweep's state written after every decision.

Each trial runs in a thread of this process. A result reaches :meth:`Sweep.on_result` from the
trial's own thread (``tune.report`` of a function trainable, or ``TuneReportCallback`` in a
Train run, on the driver side once the round is committed); the scheduler decides there and
then, and a trial it stops raises :class:`RunStopped` at that very report: a Train run's
controller stops its workers and records the run as ``stopped``.

The sweep is also the :class:`~phalanx._foundation.run_scope.RunScope` of its trials' ``fit()``
calls: it puts each run in the sweep's directory under the trial's name, adds the
``TuneReportCallback`` a run needs, warm-starts an exploited trial and holds the run back until
the machine has room for its workers.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from phalanx._foundation.run_scope import RunStopped, set_current
from phalanx.checkpoint import Checkpoint
from phalanx.errors import ConfigError
from phalanx.tune._callback import TuneReportCallback
from phalanx.tune._config import RunConfig, TuneConfig
from phalanx.tune._resources import RESOURCES_ATTR, ResourcePool, trainer_demand
from phalanx.tune._session import set_active
from phalanx.tune._trial import ERROR, PENDING, TERMINATED, Trial
from phalanx.tune.schedulers import FIFOScheduler, TrialScheduler
from phalanx.tune.search._default import default_searcher
from phalanx.tune.search._searcher import Searcher

__all__ = ["STATE_FILE", "Sweep", "TrialExploited"]

logger = logging.getLogger(__name__)

STATE_FILE = "tuner_state.json"  # what phalanx ui and phalanx show read (ui/_sweeps.py)
TUNER_FILE = "tuner.pkl"  # the trainable-free part of the Tuner, for Tuner.restore
DEFAULT_DEMAND = {"CPU": 1.0}  # a function trainable's share without with_resources


class TrialExploited(RunStopped):
    """PopulationBasedTraining restarts the trial from another trial's checkpoint."""


class Sweep:
    def __init__(
        self,
        trainable: Any,
        param_space: dict[str, Any],
        tune_config: TuneConfig,
        run_config: RunConfig,
        path: str,
        name: str,
        trials: list[Trial] | None = None,
        searcher: Searcher | None = None,
        scheduler: TrialScheduler | None = None,
    ) -> None:
        self.trainable = trainable
        self.param_space = param_space
        self.tune_config = tune_config
        self.run_config = run_config
        self.path = path
        self.name = name
        self.trials: list[Trial] = list(trials or [])
        self.scheduler = scheduler or tune_config.scheduler or FIFOScheduler()
        metric, mode = tune_config.metric, tune_config.mode
        self.scheduler.set_search_properties(metric, mode)
        self.searcher = searcher or tune_config.search_alg
        if self.searcher is None:
            self.searcher = default_searcher(param_space, metric, mode)
        self.searcher.set_search_properties(
            metric, mode, param_space, num_samples=tune_config.num_samples
        )
        self.pool = ResourcePool.local()
        self._ray_pool: ResourcePool | None = None  # the Ray cluster's, once a run uses Ray
        self._ray_pool_lock = threading.Lock()
        self._cond = threading.Condition(threading.RLock())
        self._live: dict[str, threading.Thread] = {}
        self._placed: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._body_held: dict[str, dict[str, float]] = {}  # a function trainable's own share
        self._uid = uuid.uuid4().hex[:5]
        self._finished_searching = False
        self._failure: BaseException | None = None
        self._started = time.time()

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> list[Trial]:
        os.makedirs(self.path, exist_ok=True)
        for trial in self.trials:
            self.scheduler.on_trial_add(self, trial)
            if not trial.is_finished():  # a restored sweep: it goes on from its checkpoint
                trial.status = PENDING
                del trial.results[trial.iterations_at_checkpoint :]
        self._replay()
        self.save("RUNNING")
        try:
            with self._cond:
                while True:
                    self._launch()
                    if not self._live and (self._finished_searching or self._failure):
                        break
                    self._cond.wait(timeout=1.0)
        except BaseException as exc:  # Ctrl-C: every trial ends at its next report
            with self._cond:
                self._failure = exc
            for thread in self._threads:
                thread.join()
            self.save("INTERRUPTED")
            raise
        for thread in self._threads:  # each has ended its trial: only its exit is left
            thread.join()
        if self._failure is not None:
            self.save("ERROR")
            raise self._failure
        self.save("FINISHED")
        return self.trials

    def _replay(self) -> None:
        """A restored sweep's searcher and scheduler hear again what they had heard."""
        for trial in self.trials:
            self.searcher.suggest(trial.trial_id)  # advances the searcher past this trial
            for result in trial.results:
                self.scheduler.on_trial_result(self, trial, result)
                self.searcher.on_trial_result(trial.trial_id, result)
            if trial.is_finished():
                self.searcher.on_trial_complete(
                    trial.trial_id, trial.last_result, error=trial.status == ERROR
                )
                self.scheduler.on_trial_complete(self, trial, trial.last_result)

    def _room(self) -> bool:
        limit = self.tune_config.max_concurrent_trials
        if limit is not None and len(self._live) >= limit:
            return False
        pools = [self.pool] if self._ray_pool is None else [self.pool, self._ray_pool]
        if any(p.waiting for p in pools) or any(t not in self._placed for t in self._live):
            return False  # a trial still waits for its share: no more room
        return not self._live or any(p.free().get("CPU", 0.0) > 0 for p in pools)

    def _launch(self) -> None:
        while not self._failure and self._room():
            trial = next((t for t in self.trials if t.status == PENDING), None)
            if trial is None:
                trial = self._new_trial()
            if trial is None:
                return
            trial.begin()
            thread = threading.Thread(
                target=self._trial_thread, args=(trial,), name=f"phalanx-trial-{trial.trial_id}"
            )
            self._live[trial.trial_id] = thread
            self._threads.append(thread)
            thread.start()

    def _new_trial(self) -> Trial | None:
        if self._finished_searching or self._over_budget():
            return None
        total = self.searcher.total_samples
        if total is None and self.tune_config.num_samples != -1:
            total = self.tune_config.num_samples
        if total is not None and len(self.trials) >= total:
            self._finished_searching = True
            return None
        trial_id = f"{self._uid}_{len(self.trials):05d}"
        suggestion = self.searcher.suggest(trial_id)
        if suggestion == Searcher.FINISHED:
            self._finished_searching = True
            return None
        if suggestion is None:
            return None  # asked again when a trial ends
        assert isinstance(suggestion, dict)
        trial = Trial(
            trial_id=trial_id,
            trial_name=f"{trainable_name(self.trainable)}_{trial_id}",
            config=suggestion,
            sweep_name=self.name,
            sweep_path=self.path,
            resources=dict(getattr(self.trainable, RESOURCES_ATTR, DEFAULT_DEMAND)),
        )
        creator = self.tune_config.trial_dirname_creator or self.tune_config.trial_name_creator
        if creator is not None:  # the trial's name is its directory's
            trial.trial_name = str(creator(trial))
        self.trials.append(trial)
        self.scheduler.on_trial_add(self, trial)
        return trial

    # -- a trial's thread ---------------------------------------------------------------------

    def _trial_thread(self, trial: Trial) -> None:
        set_active(trial, self)
        set_current(self)
        error: BaseException | None = None
        interrupted = False
        try:
            while True:
                try:
                    with self._body_share(trial):
                        self._call_trainable(trial)
                    error = None
                    break
                except TrialExploited:
                    continue  # its next run starts at once from the donor's checkpoint
                except RunStopped:
                    error = None
                    if self._failure is not None:  # the sweep ended it: restore resumes it
                        interrupted = True
                    break
                except Exception as exc:
                    error = exc
                    limit = self.run_config.failure_config.max_failures
                    with self._cond:
                        trial.num_failures += 1
                        retry = limit == -1 or trial.num_failures <= limit
                    if not retry:
                        logger.error(
                            "Trial %s failed: %s: %s", trial.trial_name, type(exc).__name__, exc,
                            exc_info=exc,
                        )  # fmt: skip
                        break
                    logger.warning(
                        "Trial %s failed (%s: %s); retrying from its latest checkpoint.",
                        trial.trial_name, type(exc).__name__, exc,
                    )  # fmt: skip
                    with self._cond:
                        del trial.results[trial.iterations_at_checkpoint :]
        except BaseException as exc:  # Ctrl-C in a trial, or phalanx failing: end the sweep
            error = exc
            with self._cond:
                self._failure = exc
        finally:
            self._end_trial(trial, error, interrupted)

    @contextlib.contextmanager
    def _body_share(self, trial: Trial) -> Iterator[None]:
        """A function trainable's share while it runs (a Trainer given to the Tuner takes its
        workers' share in fit())."""
        from phalanx.trainer import BaseTrainer

        if isinstance(self.trainable, BaseTrainer):
            self._mark_placed(trial)
            yield
            return
        with self._cond:
            self._placed.discard(trial.trial_id)
        with self.pool.hold(trial.resources, lambda: self._mark_placed(trial), _index(trial)):
            self._body_held[trial.trial_id] = trial.resources
            try:
                yield
            finally:
                self._body_held.pop(trial.trial_id, None)

    @contextlib.contextmanager
    def _hold_for_fit(self, trial: Trial, trainer: Any) -> Iterator[None]:
        """The Train run's workers' share, in place of the trial's own while it runs: of this
        machine, or of the Ray cluster for a run on the Ray engine."""
        into = self._ray_cluster_pool() if _uses_ray(trainer) else None
        with self._cond:
            self._placed.discard(trial.trial_id)
        held = self._body_held.get(trial.trial_id, {})
        placed = functools.partial(self._mark_placed, trial)
        with self.pool.swap(held, trainer_demand(trainer), placed, _index(trial), into=into):
            yield

    def _ray_cluster_pool(self) -> ResourcePool:
        with self._ray_pool_lock:  # not under the sweep's lock: starting Ray takes seconds
            if self._ray_pool is None:
                pool = ResourcePool.ray_cluster()
                with self._cond:
                    self._ray_pool = pool
            return self._ray_pool

    def _mark_placed(self, trial: Trial) -> None:
        with self._cond:
            self._placed.add(trial.trial_id)
            self._cond.notify_all()

    def _call_trainable(self, trial: Trial) -> None:
        from phalanx.trainer import BaseTrainer

        config = copy.deepcopy(trial.config)
        if isinstance(self.trainable, BaseTrainer):
            air_trainer(self.trainable, config).fit()
        else:
            self.trainable(config)

    def _end_trial(self, trial: Trial, error: BaseException | None, interrupted: bool) -> None:
        with self._cond:
            trial.time_total_s = time.time() - trial.started
            if interrupted:  # not finished: Tuner.restore goes on from its checkpoint
                self._live.pop(trial.trial_id, None)
                self._placed.discard(trial.trial_id)
                self._cond.notify_all()
                return
            trial.status = ERROR if error is not None else TERMINATED
            trial.error = None if error is None else f"{type(error).__name__}: {error}"
            if error is None:
                self.searcher.on_trial_complete(trial.trial_id, trial.last_result)
                self.scheduler.on_trial_complete(self, trial, trial.last_result)
            else:
                self.searcher.on_trial_complete(trial.trial_id, None, error=True)
                self.scheduler.on_trial_error(self, trial)
            self._live.pop(trial.trial_id, None)
            self._placed.discard(trial.trial_id)
            self.save("RUNNING")
            self._cond.notify_all()

    # -- results ------------------------------------------------------------------------------

    def on_result(
        self,
        trial: Trial,
        metrics: dict[str, Any],
        checkpoint: Checkpoint | None,
    ) -> None:
        """One result of ``trial`` (in its thread): recorded, decided on; raises RunStopped when
        the trial ends here and TrialExploited when PBT restarts it."""
        if self._failure is not None:  # the sweep is ending (Ctrl-C, an internal error)
            raise RunStopped("the sweep was interrupted")
        with self._cond:
            now = time.time()
            result = dict(metrics)
            result.update(
                training_iteration=trial.iterations + 1,
                trial_id=trial.trial_id,
                time_total_s=now - trial.started,
                timestamp=now,
                done=False,
            )
            trial.results.append(result)
            if checkpoint is not None:
                trial.checkpoint_path = checkpoint.path
                trial.iterations_at_checkpoint = trial.iterations
            self.searcher.on_trial_result(trial.trial_id, result)
            decision = self.scheduler.on_trial_result(self, trial, result)
            if decision == TrialScheduler.CONTINUE and self._meets_stop(trial, result):
                decision = TrialScheduler.STOP
            if decision == TrialScheduler.STOP:
                trial.stopped_early = True
                result["done"] = True
            if decision == TrialScheduler.PAUSE:  # PBT exploited: copy the donor's checkpoint in
                self._take_donor_checkpoint(trial)
            self.save("RUNNING")
        if decision == TrialScheduler.STOP:
            raise RunStopped(f"the sweep's scheduler stopped trial {trial.trial_id}")
        if decision == TrialScheduler.PAUSE:
            raise TrialExploited(f"trial {trial.trial_id} goes on from another trial's checkpoint")

    def _over_budget(self) -> bool:
        """TuneConfig(time_budget_s=...) spent: no new trial, and each running one stops."""
        budget = self.tune_config.time_budget_s
        return budget is not None and time.time() - self._started > budget

    def _meets_stop(self, trial: Trial, result: dict[str, Any]) -> bool:
        if self._over_budget():
            return True
        stop = self.run_config.stop
        if stop is None:
            return False
        if callable(stop):
            return bool(stop(trial.trial_id, result))
        return any(k in result and result[k] >= v for k, v in stop.items())

    def _take_donor_checkpoint(self, trial: Trial) -> None:
        source = trial.restore_path
        if source is None:
            return
        target = os.path.join(self.path, trial.trial_name, f"pbt_checkpoint_{trial.segment:04d}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        trial.checkpoint_path = target
        trial.restore_path = target

    def function_report(
        self, trial: Trial, metrics: dict[str, Any], checkpoint: Checkpoint | None
    ) -> None:
        """``tune.report`` of a function trainable: its checkpoint copied into the trial's
        directory, then decided on as any result."""
        committed = None
        if checkpoint is not None:
            committed = self._commit_checkpoint(trial, checkpoint)
        self.on_result(trial, metrics, committed)

    def _commit_checkpoint(self, trial: Trial, checkpoint: Checkpoint) -> Checkpoint:
        trial_dir = os.path.join(self.path, trial.trial_name)
        os.makedirs(trial_dir, exist_ok=True)
        final = os.path.join(trial_dir, f"checkpoint_{trial.iterations:06d}")
        staging = f"{final}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        checkpoint.to_directory(staging)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)  # a killed driver leaves a .tmp, never a half checkpoint
        keep = self.run_config.checkpoint_config.num_to_keep
        if keep is not None:
            kept = sorted(d for d in os.listdir(trial_dir) if _is_checkpoint_dir(d))
            for old in kept[: max(len(kept) - keep, 0)]:
                if os.path.join(trial_dir, old) != trial.restore_path:
                    shutil.rmtree(os.path.join(trial_dir, old), ignore_errors=True)
        return Checkpoint(final)

    def trial_checkpoint(self, trial: Trial) -> Checkpoint | None:
        with self._cond:
            return trial.checkpoint

    # -- the RunScope of the trials' fit() ---------------------------------------------------

    @contextlib.contextmanager
    def enter_fit(self, trainer: Any) -> Iterator[None]:
        from phalanx.tune._session import active

        found = active()
        if found is None:  # a fit() in a thread the trial started: an ordinary run
            yield
            return
        trial = found[0]
        run_config = trainer.run_config
        callbacks = list(run_config.callbacks)
        if not any(isinstance(c, TuneReportCallback) for c in callbacks):
            callbacks.append(TuneReportCallback())
        name = trial.run_name
        if run_config.name is not None:
            name = run_config.name if trial.segment == 0 else f"{run_config.name}-{trial.segment}"
        storage_path = run_config.storage_path or self.path
        trainer.run_config = dataclasses.replace(
            run_config, name=name, storage_path=storage_path, callbacks=callbacks
        )
        with self._cond:
            run_path = os.path.join(storage_path, name)
            if not trial.run_names or trial.run_names[-1] != name:
                trial.run_names.append(name)
            if trial.segment and trial.checkpoint_path and trainer.resume_from_checkpoint is None:
                trainer.resume_from_checkpoint = Checkpoint(trial.checkpoint_path)
            logger.debug("Trial %s runs %s", trial.trial_id, run_path)
        import_worker_modules(trainer)  # before the run forks its workers
        with self._hold_for_fit(trial, trainer):
            yield

    # -- the state ------------------------------------------------------------------------------

    def save(self, status: str) -> None:
        state = {
            "name": self.name,
            "status": status,
            # the scheduler's or searcher's own metric when TuneConfig has none (Ray's form)
            "metric": self.tune_config.metric or self.scheduler.metric or self.searcher.metric,
            "mode": self.tune_config.mode or self.scheduler.mode or self.searcher.mode,
            "num_samples": self.tune_config.num_samples,
            "scheduler": type(self.scheduler).__name__,
            "search_alg": type(self.searcher).__name__,
            "trainable": trainable_name(self.trainable),
            "started": self._started,
            "updated": time.time(),
            "trials": [t.to_json() for t in self.trials],
        }
        path = os.path.join(self.path, STATE_FILE)
        staging = f"{path}.tmp"
        with open(staging, "w") as f:
            json.dump(state, f, default=_json_default)
        os.replace(staging, path)


_imports_lock = threading.Lock()
_imported: set[str] = set()


def import_worker_modules(trainer: Any) -> None:
    """Import in the sweep's driver what the trial's workers would each import again: the
    backend's ``preload_modules`` (``torch._dynamo`` for a TorchTrainer: over a second of CPU
    in every new worker, as the first optimizer or DDP() imports it). The local engine forks
    its workers from a copy of the driver, so every trial's workers start with them: a sweep
    pays the import once instead of once per worker of every trial. Nothing for the Ray engine
    (its workers are actors) or a run in the driver (``num_workers=0``).

    Every local trial's ``fit()`` passes the lock, also once the import is done: a fork while
    another thread is inside an import would leave that module's import lock held for good in
    the copy (its workers hang at their first use of it)."""
    from phalanx._internal.engines.choose import engine_name

    if trainer.scaling_config.num_workers == 0:
        return
    try:
        if engine_name(trainer.scaling_config) != "local":
            return
    except ConfigError:  # fit() says so itself
        return
    backend = getattr(trainer, "backend_config", None)
    modules = tuple(getattr(backend, "preload_modules", ()) or ())
    with _imports_lock:  # one thread imports; no trial forks meanwhile (they wait here)
        for module in modules:
            if module in _imported:
                continue
            _imported.add(module)
            try:
                importlib.import_module(module)
            except Exception as exc:  # the workers would import it themselves, and say why
                logger.debug("Could not import %s for the trials' workers: %s", module, exc)


def air_trainer(trainer: Any, config: dict[str, Any]) -> Any:
    """A copy of the Tuner's Trainer for one trial (``param_space={"train_loop_config": ...}``,
    Ray's AIR form): ``train_loop_config`` merged into the trainer's, other keys set."""
    copied = copy.copy(trainer)
    # each trial is its own run in the sweep's directory, whatever the trainer's name was
    copied.run_config = dataclasses.replace(trainer.run_config, name=None, storage_path=None)
    for key, value in config.items():
        if key == "train_loop_config":
            copied.train_loop_config = {**(trainer.train_loop_config or {}), **value}
        elif hasattr(trainer, key):
            setattr(copied, key, value)
        else:
            raise ConfigError(
                f"param_space key {key!r} is no argument of {type(trainer).__name__}.\nHINT: "
                'put the training function\'s hyperparameters under "train_loop_config".'
            )
    return copied


def trainable_name(trainable: Any) -> str:
    if isinstance(trainable, type):
        return trainable.__name__
    name = getattr(trainable, "__name__", None) or type(trainable).__name__
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name)


def _uses_ray(trainer: Any) -> bool:
    """The trainer's run has workers on the Ray engine."""
    from phalanx._internal.engines.choose import engine_name

    if trainer.scaling_config.num_workers == 0:
        return False
    try:
        return engine_name(trainer.scaling_config) == "ray"
    except ConfigError:  # fit() says so itself
        return False


def _index(trial: Trial) -> int:
    """The trial's place in the sweep (its id ends in it): older trials get resources first."""
    tail = trial.trial_id.rpartition("_")[2]
    return int(tail) if tail.isdigit() else 0


def _is_checkpoint_dir(name: str) -> bool:
    return name.startswith("checkpoint_") and not name.endswith(".tmp")


def _json_default(value: Any) -> Any:
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    item = getattr(value, "item", None)  # numpy and torch scalars
    if callable(item):
        with contextlib.suppress(Exception):
            return item()
    return repr(value)
