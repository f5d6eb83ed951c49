"""Sweeps in the phalanx command: ``phalanx ls`` lists them after the runs, ``phalanx show
<sweep>`` prints its trials table and ``phalanx compare <sweep>`` its trials side by side.

A sweep is a directory of the storage path with the state ``phalanx.tune`` writes
(``tuner_state.json``): its trials, their configs, statuses and results. Read only.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from phalanx.cli import _text as text
from phalanx.cli._runs import flatten, is_number

__all__ = [
    "compare_sweep",
    "find_sweeps",
    "handled",
    "ls_sweeps",
    "read_sweep",
    "show_sweep",
    "sweep_path",
]

Out = Callable[[str], None]
STATE_FILE = "tuner_state.json"  # phalanx.tune._state.STATE_FILE


def handled(args: argparse.Namespace, out: Out) -> bool:
    """Runs ``phalanx ls`` when the storage path holds sweeps (its runs, then its sweeps), and
    ``show``/``compare`` of a sweep; False when the command is not about sweeps."""
    if args.command == "ls":
        from phalanx._foundation.env import default_storage_path
        from phalanx.cli import _commands as commands
        from phalanx.cli._runs import CLIError, find_runs

        storage_path = args.storage_path or default_storage_path()
        found = find_sweeps(storage_path)
        if not found:
            return False
        try:
            commands.ls(find_runs(storage_path), args.sort, args.desc, out)
        except CLIError:  # only sweeps there
            pass
        ls_sweeps(found, out)
        return True
    if args.command == "show" and (path := sweep_path(args.run)):
        show_sweep(path, read_sweep(path) or {}, out)
        return True
    if args.command == "compare" and len(args.runs) == 1 and (path := sweep_path(args.runs[0])):
        compare_sweep(read_sweep(path) or {}, args.all, out)
        return True
    return False


def read_sweep(path: str) -> dict[str, Any] | None:
    """The sweep's state at ``path`` (a local directory), or None when it is no sweep."""
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def sweep_path(argument: str) -> str | None:
    """The sweep directory a ``<run>`` argument names (a path, or a name in the default
    storage), or None when it names no sweep."""
    if "://" in argument:
        return None
    from phalanx._foundation.env import default_storage_path

    for path in (argument, os.path.join(default_storage_path(), argument)):
        if read_sweep(path) is not None:
            return path
    return None


def find_sweeps(storage_path: str) -> list[dict[str, Any]]:
    """Every sweep directly under a local ``storage_path``, oldest first."""
    if "://" in storage_path or not os.path.isdir(storage_path):
        return []
    sweeps = []
    for name in sorted(os.listdir(storage_path)):
        state = read_sweep(os.path.join(storage_path, name))
        if state is not None:
            sweeps.append({**state, "name": name})
    return sorted(sweeps, key=lambda s: s.get("started") or 0)


def _best(state: dict[str, Any], trial: dict[str, Any]) -> float | None:
    metric, mode = state.get("metric"), state.get("mode")
    if not metric:
        return None
    values = [r[metric] for r in trial.get("results", []) if is_number(r.get(metric))]
    if not values:
        return None
    return min(values) if mode == "min" else max(values)


def _best_trial(state: dict[str, Any]) -> tuple[dict[str, Any], float] | None:
    scored = [(t, b) for t in state.get("trials", []) if (b := _best(state, t)) is not None]
    if not scored:
        return None
    sign = -1 if state.get("mode") == "min" else 1
    return max(scored, key=lambda pair: sign * pair[1])


def ls_sweeps(sweeps: list[dict[str, Any]], out: Out) -> None:
    rows = []
    for state in sweeps:
        trials = state.get("trials", [])
        done = sum(t.get("status") in ("TERMINATED", "ERROR") for t in trials)
        best = _best_trial(state)
        best_text = (
            f"{state.get('metric')}={text.value(best[1])} ({best[0]['trial_id']})" if best else ""
        )
        rows.append([
            state["name"],
            str(state.get("status", "")),
            f"{done}/{len(trials)}",
            str(state.get("scheduler", "")),
            str(state.get("search_alg", "")),
            best_text,
        ])  # fmt: skip
    out("")
    out(text.table(["SWEEP", "STATUS", "TRIALS", "SCHEDULER", "SEARCH", "BEST"], rows))


def _config_columns(trials: list[dict[str, Any]], show_all: bool) -> list[str]:
    configs = [flatten(t.get("config") or {}) for t in trials]
    keys = sorted({k for c in configs for k in c})
    if show_all or len(configs) < 2:
        return keys
    return [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]


def show_sweep(path: str, state: dict[str, Any], out: Out) -> None:
    """The sweep's header and one row per trial: config, status, best metric, iterations."""
    trials = state.get("trials", [])
    metric = state.get("metric")
    out(f"Sweep {state.get('name') or os.path.basename(path)}: {state.get('status', '')}")
    out(f"  path        {path}")
    out(f"  metric      {metric or '-'} ({state.get('mode') or '-'})")
    out(f"  scheduler   {state.get('scheduler', '')}; search {state.get('search_alg', '')}")
    best = _best_trial(state)
    if best:
        out(f"  best        {best[0]['trial_id']}: {metric}={text.value(best[1])}")
    out("")
    keys = _config_columns(trials, show_all=True)
    header = ["TRIAL", "STATUS", "ITER", f"BEST {metric}" if metric else "LAST METRICS", *keys]
    rows = []
    for trial in trials:
        config = flatten(trial.get("config") or {})
        if metric:
            value = _best(state, trial)
            summary = text.value(value) if value is not None else ""
        else:
            summary = text.metrics_line(_metrics(trial))
        status = str(trial.get("status", ""))
        if trial.get("stopped_early"):
            status += " (stopped)"
        rows.append([
            trial.get("trial_id", ""), status, str(trial.get("iterations", 0)), summary,
            *[_cell(config.get(k)) for k in keys],
        ])  # fmt: skip
    out(text.table(header, rows))
    errors = [t for t in trials if t.get("error")]
    for trial in errors:
        out(f"\n{trial['trial_id']} failed: {trial['error']}")


def compare_sweep(state: dict[str, Any], show_all: bool, out: Out) -> None:
    """Every trial side by side: the config keys that differ (all with ``--all``) and the
    last value of each metric."""
    trials = state.get("trials", [])
    keys = _config_columns(trials, show_all)
    metrics = sorted({k for t in trials for k, v in _metrics(t).items() if is_number(v)})
    header = ["TRIAL", "STATUS", "ITER", *keys, *metrics]
    rows = []
    for trial in trials:
        config = flatten(trial.get("config") or {})
        last = _metrics(trial)
        rows.append([
            trial.get("trial_id", ""), str(trial.get("status", "")),
            str(trial.get("iterations", 0)),
            *[_cell(config.get(k)) for k in keys],
            *[text.value(last[m]) if is_number(last.get(m)) else "" for m in metrics],
        ])  # fmt: skip
    out(text.table(header, rows))


_RESULT_KEYS = {"trial_id", "timestamp", "done", "time_total_s", "training_iteration"}


def _metrics(trial: dict[str, Any]) -> dict[str, Any]:
    last = trial.get("last_result") or (trial.get("results") or [{}])[-1]
    return {
        k: v for k, v in flatten(last).items() if k not in _RESULT_KEYS and "all_ranks" not in k
    }


def _cell(value: object) -> str:
    if value is None:
        return ""
    return text.value(value) if is_number(value) else str(value)
