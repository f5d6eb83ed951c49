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
from phalanx.tune._callback import TuneReportCallback
from phalanx.tune._config import RunConfig, TuneConfig
from phalanx.tune._holding import Shares
from phalanx.tune._resources import RESOURCES_ATTR
from phalanx.tune._session import set_active
from phalanx.tune._state import commit_checkpoint, write_state
from phalanx.tune._trainable import air_trainer, import_worker_modules, trainable_name
from phalanx.tune._trial import ERROR, PENDING, TERMINATED, Trial
from phalanx.tune.schedulers import FIFOScheduler, TrialScheduler
from phalanx.tune.search._default import default_searcher
from phalanx.tune.search._searcher import Searcher

__all__ = ["Sweep", "TrialExploited"]

logger = logging.getLogger(__name__)

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
        self._cond = threading.Condition(threading.RLock())
        self.shares = Shares(self._cond)
        self._live: dict[str, threading.Thread] = {}
        self._threads: list[threading.Thread] = []
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
        return self.shares.room(self._live, self.tune_config.max_concurrent_trials)

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
                    with self.shares.body(trial, self.trainable):
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
                self.shares.ended(trial)
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
            self.shares.ended(trial)
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
                trial.checkpoint_filesystem = None if checkpoint._local else checkpoint.filesystem
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
        trial.checkpoint_path, trial.checkpoint_filesystem = target, None
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
        keep = self.run_config.checkpoint_config.num_to_keep
        return commit_checkpoint(trial_dir, trial.iterations, checkpoint, keep, trial.restore_path)

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
                trainer.resume_from_checkpoint = trial.checkpoint
            logger.debug("Trial %s runs %s", trial.trial_id, run_path)
        import_worker_modules(trainer)  # before the run forks its workers
        with self.shares.for_fit(trial, trainer):
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
        write_state(self.path, state)
