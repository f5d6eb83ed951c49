"""The built-in training loop of every GBDT trainer, its keyword check and its probe, written
once against :class:`~phalanx._gbdt.library.BoostingLibrary`."""

from __future__ import annotations

import inspect
import logging
import warnings
from typing import TYPE_CHECKING

from phalanx._gbdt.library import BoostingLibrary, ModelT
from phalanx._gbdt.reporting import find_or_add_reporter
from phalanx._gbdt.spec import TRAIN, GBDTSpec, read_frames, split_frame
from phalanx.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["builtin_loop", "check_train_kwargs", "probe"]

logger = logging.getLogger(__name__)


def builtin_loop(
    library: BoostingLibrary[ModelT], spec: GBDTSpec, config: dict[str, object] | None = None
) -> None:
    """On every worker: boost ``spec.num_boost_round`` rounds in total on this worker's shards,
    from the latest checkpoint's model when there is one."""
    import phalanx.session as session

    checkpoint = session.get_checkpoint()
    start = None
    if checkpoint is not None:
        start = library.report_callback.get_model(checkpoint)
    done = library.rounds_done(start) if start is not None else 0
    if start is not None and done >= spec.num_boost_round:
        # A finished run resumed: its model and metrics are the run's already; boosting zero
        # rounds would only commit one more checkpoint with empty metrics.
        logger.info("The checkpoint's model has all %d rounds; nothing to train.", done)
        return
    if start is not None:
        logger.info("Continuing from a checkpoint's model with %d rounds.", done)
    frames = read_frames(spec, library.column_keys)
    train_data = library.make_data(frames[TRAIN])
    evals = {TRAIN: train_data}
    evals.update({n: library.make_data(f, train_data) for n, f in frames.items() if n != TRAIN})
    kwargs = dict(spec.train_kwargs)
    callbacks = list(kwargs.pop("callbacks", None) or [])
    reporter = find_or_add_reporter(callbacks, library.report_callback, spec)
    model = library.train(
        library.worker_params(spec.params_with_threads(library.thread_params)),
        train_data,
        evals,
        spec.remaining_rounds(done),
        start,
        callbacks,
        **kwargs,
    )
    # Saves the final checkpoint when training stopped early; a no-op where the library
    # already called it (XGBoost's callbacks have an after_training hook, LightGBM's do not).
    reporter.after_training(model)


def check_train_kwargs(library: BoostingLibrary[ModelT], spec: GBDTSpec) -> None:
    """``train_kwargs`` must be arguments of the library's training function that the built-in
    loop does not set itself."""
    function = library.train_function
    own_args = library.own_args
    accepted = (set(inspect.signature(function).parameters) - own_args) | library.extra_args
    where = f"{function.__module__.split('.')[0]}.{function.__name__}"
    own = sorted(set(spec.train_kwargs) & own_args)
    if own:
        raise ConfigError(
            f"{library.trainer} got {own} as keyword arguments, which the built-in loop sets "
            "itself.\nHINT: pass params=, num_boost_round= and datasets= instead."
        )
    unknown = sorted(set(spec.train_kwargs) - accepted)
    if unknown:
        raise ConfigError(
            f"{library.trainer} got unknown keyword argument(s) {unknown}: extra keywords go to "
            f"{where}, which accepts {sorted(accepted)}.\nHINT: booster parameters "
            f"({library.param_examples}, ...) go in params=."
        )


def probe(library: BoostingLibrary[ModelT], spec: GBDTSpec, head: pd.DataFrame) -> None:
    """On the driver: train one round on ``head`` (the first rows of the training data) with
    ``spec.params``, so the library's own error comes now rather than from every worker later."""
    frame = split_frame(
        head, spec.label_column, spec.dmatrix_params.get(TRAIN, {}), library.column_keys
    )
    kwargs = {k: v for k, v in spec.train_kwargs.items() if k in library.probe_args}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            data = library.make_data(frame)
            evals = {TRAIN: library.make_data(frame, data)}
            library.train(library.probe_params(spec.params), data, evals, 1, None, None, **kwargs)
    except library.probe_errors() as exc:
        raise ConfigError(
            f"{library.name} rejected the training setup (params={spec.params!r}, tried on the "
            f"first {frame.num_rows} rows of datasets['train']):\n{library.probe_message(exc)}"
        ) from exc
    for warning in caught:
        if not library.probe_warning(str(warning.message)):
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
