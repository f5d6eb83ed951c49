"""Several runs side by side, as the compare page shows them: each metric's curves overlaid (one
chart per metric, one curve per run) and the configuration keys whose values differ."""

from __future__ import annotations

from phalanx.cli._text import flat_config
from phalanx.ui._run_view import CONFIG_KEYS, RunState, load, summary

# Differ by definition, or say where, not how: not configuration differences.
NOT_COMPARED = ("run_config.name", "run_config.storage_path")


def compare(states: list[RunState], points: int, show_all: bool = False) -> dict[str, object]:
    """The runs' summaries, every metric's downsampled curve per run, and the config rows
    (``{"key", "values": [one per run, None where unset], "differs"}``; only differing keys
    unless ``show_all``)."""
    loaded = [load(state.reader) for state in states]
    runs = [summary(s.run_id, s.reader, d) for s, d in zip(states, loaded)]
    metrics: dict[str, dict[str, object]] = {}
    for state in states:
        state.series.refresh()
        chart = state.series.chart(points)
        for name in chart["names"]:
            metrics.setdefault(name, {})[state.run_id] = chart["metrics"][name]
    configs = [_comparable(d.record) for d in loaded]
    keys = sorted(set().union(*configs)) if configs else []
    rows = []
    for key in keys:
        values = [c.get(key) for c in configs]
        differs = len({repr(v) for v in values}) > 1
        if differs or show_all:
            rows.append({"key": key, "values": values, "differs": differs})
    return {"runs": runs, "metrics": metrics, "config": rows, "all": show_all}


def _comparable(record: dict[str, object]) -> dict[str, object]:
    flat: dict[str, object] = {}
    for key in (*CONFIG_KEYS, "versions"):
        if key in record:
            flat.update(flat_config(record[key], f"{key}."))
    for key in NOT_COMPARED:
        flat.pop(key, None)
    return flat
