"""``phalanx ls``, ``show``, ``metrics`` and ``compare``: what is in storage, as text."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from phalanx._foundation.goodput_parts import Goodput
from phalanx._foundation.optional import require
from phalanx._internal.controller.anatomy import excess_line
from phalanx._internal.worker.data_position import dataset_records, read_record
from phalanx.cli import _text as text
from phalanx.cli._runs import CLIError, RunView, flatten, is_number

Out = Callable[[str], None]
# run.json's configuration, as `show` lists it and `compare` sets it side by side
CONFIG_KEYS = ("trainer", "train_loop_config", "scaling_config", "run_config", "backend_config")

# --- ls ----------------------------------------------------------------------------------------

SORT_FIELDS: dict[str, Callable[[RunView], Any]] = {
    "name": lambda run: run.name,
    "started": lambda run: run.started,
    "duration": lambda run: run.duration,
    "status": lambda run: run.status.status,
    "attempts": lambda run: len(run.attempts),
}


def ls(runs: list[RunView], sort: str | None, descending: bool, out: Out) -> None:
    """One line per run; sorted by start time, or by ``sort`` (a column or a metric's last value;
    runs without it come last)."""
    key = sort or "started"
    if key not in SORT_FIELDS and not any(key in flatten(r.last_metrics) for r in runs):
        known = sorted({m for r in runs for m in flatten(r.last_metrics)} | set(SORT_FIELDS))
        raise CLIError(
            f"--sort {key!r}: no run has a metric or column of that name.\n"
            f"HINT: sort by one of {known}."
        )
    ranked = _sorted_runs(runs, key, descending)
    rows = [
        [
            run.name,
            str(run.status),
            str(len(run.attempts)),
            text.short_when(run.started),
            text.duration(run.duration),
            _best_column(run),
            text.metrics_line(flatten(run.last_metrics), first=sort),
        ]
        for run in ranked
    ]
    header = ["NAME", "STATUS", "ATTEMPTS", "STARTED", "DURATION", "BEST CHECKPOINT", "METRICS"]
    out(text.table(header, rows))


def _sorted_runs(runs: list[RunView], key: str, descending: bool) -> list[RunView]:
    def value(run: RunView) -> Any:
        if key in SORT_FIELDS:
            return SORT_FIELDS[key](run)
        return flatten(run.last_metrics).get(key)

    present = [r for r in runs if _sortable(value(r))]
    missing = [r for r in runs if not _sortable(value(r))]
    try:
        present.sort(key=value, reverse=descending)
    except TypeError:  # numbers in some runs, strings in others
        present.sort(key=lambda r: str(value(r)), reverse=descending)
    return present + missing


def _sortable(v: object) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _best_column(run: RunView) -> str:
    best = run.best_checkpoint()
    return best[0] if best else "-"


# --- show --------------------------------------------------------------------------------------


def show(run: RunView, out: Out) -> None:
    record = run.config
    out(f"run:          {run.uri}")
    out(f"status:       {run.status}" + (f"  ({run.status.how})" if run.status.how else ""))
    out(f"started:      {text.when(run.started)}")
    fits = record.get("fits")
    if isinstance(fits, int) and fits > 1:  # resumed: fit() again with the same name
        out(f"first start:  {text.when(record.get('first_started'))} ({fits} fit() calls)")
    out(f"ended:        {text.when(run.ended)}")
    out(f"duration:     {text.duration(run.duration)}")
    _show_goodput(record.get("goodput"), out)
    driver = record.get("driver") or {}
    if driver:
        out(f"driver:       host {driver.get('host')}, pid {driver.get('pid')}")
    if record.get("versions"):
        out("versions:     " + ", ".join(f"{k} {v}" for k, v in record["versions"].items()))
    out(f"attempts:     {len(run.attempts)}")
    for attempt in run.attempts:
        out("  " + _attempt_line(attempt))
    _show_stragglers(record.get("stragglers"), out)
    out(f"rounds:       {len(run.history)}")
    out(f"metrics:      {text.metrics_line(flatten(run.last_metrics), limit=400) or '-'}")
    _show_checkpoints(run, out)
    _show_data_position(run, out)
    _show_config(record, out)
    if run.error:
        out("error:")
        for line in run.error.rstrip().splitlines():
            out(f"  {line}")


def _attempt_line(attempt: dict[str, Any]) -> str:
    started, ended = attempt.get("started"), attempt.get("ended")
    took = ended - started if is_number(started) and is_number(ended) else None
    outcome = attempt.get("outcome") or "(no outcome recorded)"
    line = (
        f"#{attempt.get('attempt', '?')}  {text.short_when(started)}  "
        f"{text.duration(took):>12}  {outcome}"
    )
    error = text.first_line(attempt.get("error"))
    return f"{line}: {error}" if error else line


def _show_goodput(data: object, out: Out) -> None:
    """run.json's goodput breakdown: the summary, then seconds per part (nothing without one)."""
    if not isinstance(data, dict):
        return
    try:
        goodput = Goodput.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError):  # edited by hand: say so, go on
        out("goodput:      (unreadable in run.json)")
        return
    out(f"goodput:      {goodput.summary().removeprefix('goodput ')}")
    out("  " + "  ".join(f"{part} {seconds:.1f} s" for part, seconds in goodput.seconds.items()))


def _show_stragglers(periods: object, out: Out) -> None:
    """run.json's straggler periods, one line each (nothing for a run that had none)."""
    if not isinstance(periods, list) or not periods:
        return
    out(f"stragglers:   {len(periods)}")
    for p in (p for p in periods if isinstance(p, dict)):
        gpus = p.get("gpu_ids") or []
        where = f"host {p.get('host')}, node {p.get('node_id')}" + (
            f", GPU {', '.join(map(str, gpus))}" if gpus else ""
        )
        started = p.get("started")
        when = text.short_when(started, seconds=True) if is_number(started) else "-"
        out(
            f"  rank {p.get('rank')}  {p.get('slowdown')}x  rounds {p.get('first_round')}-"
            f"{p.get('last_round')} of attempt {p.get('attempt')}  {when}  ({where})"
        )
        if p.get("cause"):  # recorded since the step anatomy (older runs: the line above only)
            out(f"    {excess_line(p)} than the other ranks; {_parts_line(p)}")


def _parts_line(period: dict[str, Any]) -> str:
    """``per step: data 45 ms (others 4 ms), compute ...`` from a period's seconds."""
    mine, theirs = period.get("seconds") or {}, period.get("others_seconds") or {}
    shown = []
    for part, seconds in mine.items():
        if is_number(seconds):
            other = theirs.get(part)
            versus = f" (others {other * 1000:.0f} ms)" if is_number(other) else ""
            shown.append(f"{part} {seconds * 1000:.0f} ms{versus}")
    return f"per {period.get('per', 'round')}: " + ", ".join(shown)


def _show_checkpoints(run: RunView, out: Out) -> None:
    ranked = list(reversed(run.manager.best_checkpoints()))  # best first
    config = run.manager.config
    order = (
        f"best first by {config.checkpoint_score_attribute} ({config.checkpoint_score_order})"
        if config.checkpoint_score_attribute
        else "latest first"
    )
    out(f"checkpoints:  {len(ranked)} kept" + (f", {order}" if ranked else ""))
    latest = run.manager.latest.dir_name if run.manager.latest else None
    for checkpoint, metrics in ranked:
        dir_name = checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
        mark = "  (latest)" if dir_name == latest else ""
        out(f"  {dir_name}  {text.metrics_line(flatten(metrics))}{mark}")


def _show_data_position(run: RunView, out: Out) -> None:
    """Where each dataset is at the latest checkpoint (nothing when it stored no position)."""
    latest = run.manager.latest_checkpoint
    try:
        datasets = dataset_records(read_record(latest))
    except OSError as exc:  # the run's other lines are still worth showing
        out(f"data:         (unreadable: {exc})")
        return
    if not datasets or run.manager.latest is None:
        return
    from phalanx.data._position import describe

    out(f"data:         at {run.manager.latest.dir_name}")
    for name, record in datasets.items():
        try:
            total = int(record["num_rows"])
            share = int(record["consumed"]) / total if total else 1.0
            out(f"  {name}: {describe(record)} ({share:.0%})")
        except (KeyError, TypeError, ValueError):  # written by another version, or edited
            out(f"  {name}: (unreadable position record)")


def _show_config(record: Mapping[str, object], out: Out) -> None:
    if not record:
        out("config:       (not recorded: the run predates run.json)")
        return
    out("config:")
    for key in CONFIG_KEYS:
        if key not in record:
            continue
        for name, item in text.flat_config(record[key], f"{key}.").items():
            out(f"  {name} = {text.value(item)}")


# --- metrics -----------------------------------------------------------------------------------


def metrics(run: RunView, all_ranks: bool, out: Out) -> None:
    pd = require("pandas", "`phalanx metrics`")

    from phalanx._internal.storage.history import ATTEMPT_COLUMN

    rows = run.all_ranks_history() if all_ranks else run.history
    frame = pd.DataFrame(rows)
    if "timestamp" in frame:  # seconds since 1970 tell a reader nothing: the local date
        frame["timestamp"] = [
            text.short_when(t, seconds=True) if is_number(t) else t for t in frame["timestamp"]
        ]
    if ATTEMPT_COLUMN in frame and "attempt" not in frame:  # a user's "attempt" keeps its name
        frame = frame.rename(columns={ATTEMPT_COLUMN: "attempt"})
    out(frame.to_string(index=False) if len(frame) else "(no reports)")


# --- compare -----------------------------------------------------------------------------------


def compare(runs: list[RunView], show_all: bool, out: Out) -> None:
    """Configs (the differing keys, or all) and each metric's last, min and max side by side."""
    names = _labels(runs)
    configs = [_comparable_config(run.config) for run in runs]
    keys = sorted(set().union(*configs))
    rows = []
    for key in keys:
        cells = [text.value(c[key]) if key in c else "-" for c in configs]
        if show_all or len(set(cells)) > 1:
            rows.append(["*" if len(set(cells)) > 1 else " ", key, *cells])
    out("config" + ("" if show_all else " (keys that differ; --all for every key)") + ":")
    out(text.table(["", "KEY", *names], rows) if rows else "  (identical)")
    out("")
    out("metrics (last / min / max):")
    out(text.table(["METRIC", *names], _metric_rows(runs)))
    out("")
    facts = [
        ("status", lambda r: str(r.status)),
        ("attempts", lambda r: str(len(r.attempts))),
        ("duration", lambda r: text.duration(r.duration)),
        ("best checkpoint", _best_column),
    ]
    out(text.table(["RUN", *names], [[label, *map(get, runs)] for label, get in facts]))


def _labels(runs: list[RunView]) -> list[str]:
    """Run names, or their full paths where two runs share a name."""
    names = [run.name for run in runs]
    return names if len(set(names)) == len(names) else [run.uri for run in runs]


def _comparable_config(record: Mapping[str, object]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key in (*CONFIG_KEYS, "versions"):
        if key in record:
            flat.update(text.flat_config(record[key], f"{key}."))
    flat.pop("run_config.name", None)  # differs by definition
    return flat


def _metric_rows(runs: list[RunView]) -> list[list[str]]:
    names: dict[str, None] = {}
    for run in runs:
        names.update(dict.fromkeys(run.metric_names()))
    rows = []
    for metric in names:
        cells = []
        for run in runs:
            _, ys = run.metric_series(metric)
            cells.append(
                f"{text.value(ys[-1])} / {text.value(min(ys))} / {text.value(max(ys))}"
                if ys
                else "-"
            )
        rows.append([metric, *cells])
    return rows or [["(no metrics)", *["-" for _ in runs]]]
