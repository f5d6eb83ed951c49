#!/usr/bin/env python
"""Issue 42's walk of ``phalanx.report(checkpoint=...)``, counted on a real run.

Run from the repository root:

    python bench/report_walk.py                                  # this tree's src
    python bench/report_walk.py --before-src /tmp/j43-before/src # and that tree, side by side
    python bench/report_walk.py --out /tmp/walk.md               # elsewhere than bench/results

Each tree runs in a fresh Python process (``PYTHONPATH`` = that ``src``): a 1-worker
thread-engine ``fit()`` whose training function reports, one round each, a checkpoint of every
kind below. ``sys.settrace`` (and ``threading.settrace``, for the upload thread) follows the
reported ``Checkpoint`` from ``phalanx.report``: a call *carries* it when one of the values its
frame starts with (arguments, ``self``, closed-over variables) is the reported checkpoint, its
path, or something a carrying call returned (a ``Checkpoint``, an absolute path: where its
files were moved aside to). Only frames in phalanx's own files count. Along the sequence of
carrying calls (in call order, across threads):

- a *stay* is a run of consecutive calls in one file;
- *files* is the number of different files;
- a *return* is a stay in a file the walk had already left (issue 42's target: at most 6).

Kinds: ``local`` (a directory in a temporary directory, ``SYNC``: copied into the run),
``persisted`` (written in place in the run, ``NO_UPLOAD``), ``async`` (``ASYNC`` with
``delete_local_checkpoint_after_upload=False``: read by the upload thread). Writes ``report_walk.md`` and ``report_walk.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
KINDS = ("local", "persisted", "async")
TARGET_RETURNS = 6


# --------------------------------------------------------------------------- the traced run


class Walker:
    """The trace functions: a walk opens at each ``phalanx.report`` given a checkpoint."""

    def __init__(self, package_dir: str, checkpoint_class: type) -> None:
        self.checkpoint_class = checkpoint_class
        self.package_dir = package_dir.rstrip("/") + "/"
        self.walks: dict[str, list[tuple[str, str]]] = {}
        self._kind: str | None = None
        self._tracked_ids: set[int] = set()
        self._keep: list[object] = []  # tracked objects stay alive: their ids stay theirs
        self._pending: list[object] = []  # Checkpoints whose path is known once a call returns
        self._lock = threading.Lock()

    def begin(self, kind: str) -> None:
        with self._lock:
            self._kind = kind
            self.walks[kind] = []
            self._tracked_ids.clear()

    def end(self) -> None:
        with self._lock:
            self._kind = None

    def _track(self, value: object) -> None:
        """Follow ``value`` (by identity: a value equal to it that phalanx derived elsewhere,
        e.g. the committed path the driver builds from the name, is not the reported one)."""
        if isinstance(value, self.checkpoint_class) or (
            isinstance(value, str) and os.path.isabs(value)
        ):
            self._tracked_ids.add(id(value))
            self._keep.append(value)
            path = getattr(value, "path", None)  # None while its __init__ runs
            if isinstance(value, self.checkpoint_class) and isinstance(path, str):
                self._track(path)

    def _carries(self, frame: FrameType) -> bool:
        return any(id(value) in self._tracked_ids for value in frame.f_locals.values())

    def trace(self, frame: FrameType, event: str, arg: object) -> Any:
        if event != "call" or self._kind is None:
            return None
        filename = frame.f_code.co_filename
        if not filename.startswith(self.package_dir):
            return None
        with self._lock:
            if self._kind is None:
                return None
            if not self.walks[self._kind] and frame.f_code.co_name == "report":
                checkpoint = frame.f_locals.get("checkpoint")
                if checkpoint is not None:
                    self._track(checkpoint)
            if not self._carries(frame):
                return None
            rel = filename[len(self.package_dir) :]
            self.walks[self._kind].append(
                (rel, getattr(frame.f_code, "co_qualname", frame.f_code.co_name))
            )
            for value in frame.f_locals.values():  # e.g. a Checkpoint built from a tracked path
                if isinstance(value, self.checkpoint_class):
                    self._track(value)  # its path too, once the call returns
                    self._pending.append(value)
        frame.f_trace_lines = False
        return self._local_trace

    def _local_trace(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "return" and self._kind is not None:
            with self._lock:
                self._track(arg)
                while self._pending:
                    self._track(self._pending.pop())
        return None


def _train_fn(config: dict[str, Any]) -> None:
    import phalanx

    walker: Walker = sys.modules["__main__"].WALKER  # by reference: the thread engine's workers
    storage = phalanx.get_context().get_storage()
    for index, kind in enumerate(config["kinds"]):
        metrics = {"round": index}
        if kind == "persisted":
            name = f"persisted_{index}"
            path = storage.build_checkpoint_path_from_name(name)
            os.makedirs(path, exist_ok=True)
            Path(path, "weights.bin").write_bytes(b"x" * 1024)
            walker.begin(kind)
            phalanx.report(
                metrics,
                checkpoint=phalanx.Checkpoint.from_directory(path),
                checkpoint_dir_name=name,
                checkpoint_upload_mode=phalanx.CheckpointUploadMode.NO_UPLOAD,
            )
        else:
            directory = tempfile.mkdtemp(prefix=f"walk-{kind}-")
            Path(directory, "weights.bin").write_bytes(b"x" * 1024)
            mode = "ASYNC" if kind == "async" else "SYNC"
            walker.begin(kind)
            phalanx.report(
                metrics,
                checkpoint=phalanx.Checkpoint.from_directory(directory),
                checkpoint_upload_mode=phalanx.CheckpointUploadMode[mode],
                delete_local_checkpoint_after_upload=False,  # ASYNC: read on the upload thread
            )
        if kind == "async":  # the upload thread's calls belong to this walk: wait for them
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                function.endswith("stage_part") for _, function in walker.walks[kind]
            ):
                time.sleep(0.01)
            time.sleep(0.3)
        walker.end()


def run_one(kinds: list[str]) -> dict[str, Any]:
    """The walks of this process's phalanx, as one record."""
    import phalanx

    walker = Walker(os.path.dirname(phalanx.__file__), phalanx.Checkpoint)
    sys.modules["__main__"].WALKER = walker  # type: ignore[attr-defined]  # read by _train_fn
    with tempfile.TemporaryDirectory(prefix="phalanx-walk-") as tmp:
        trainer = phalanx.DataParallelTrainer(
            _train_fn,
            train_loop_config={"kinds": kinds},
            scaling_config=phalanx.ScalingConfig(num_workers=1, engine="thread"),
            run_config=phalanx.RunConfig(name="walk", storage_path=tmp),
        )
        threading.settrace(walker.trace)
        sys.settrace(walker.trace)
        try:
            result = trainer.fit()
        finally:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]  # None ends tracing of new threads
        committed = result.checkpoint is not None
    return {"walks": {k: summarize(v) for k, v in walker.walks.items()}, "committed": committed}


def summarize(calls: list[tuple[str, str]]) -> dict[str, Any]:
    stays: list[dict[str, Any]] = []
    for file, function in calls:
        if stays and stays[-1]["file"] == file:
            stays[-1]["calls"].append(function)
        else:
            stays.append({"file": file, "calls": [function]})
    seen: set[str] = set()
    returns = 0
    for stay in stays:
        if stay["file"] in seen:
            returns += 1
            stay["return"] = True
        seen.add(stay["file"])
    return {
        "calls": len(calls),
        "stays": len(stays),
        "files": len(seen),
        "returns": returns,
        "sequence": stays,
    }


# --------------------------------------------------------------------------- the driver


def _tree(src: Path) -> str:
    """``<commit>`` of the tree that holds ``src`` (``+dirty`` when it has changes in src)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(src), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "?"
    return commit + ("+dirty" if git("status", "--porcelain", "--", ".") else "")


def walk_tree(src: Path, kinds: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run(
        [sys.executable, __file__, "--one", ",".join(kinds)],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("WALK ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the walk of {src} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    record: dict[str, Any] = json.loads(lines[-1][5:])
    record.update(src=str(src), tree=_tree(src))
    return record


def render(records: dict[str, dict[str, Any]], kinds: list[str]) -> list[str]:
    lines = [
        "# Issue 42: the walk of `phalanx.report(checkpoint=...)`",
        "",
        f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Python "
        f"{platform.python_version()}, `python bench/report_walk.py` (see its docstring: "
        "a stay = consecutive carrying calls in one file; a return = a stay in a file the "
        f"walk had already left; target <= {TARGET_RETURNS} returns).",
        "- A 1-worker thread-engine fit(); each kind is one report() with a checkpoint. These "
        "are the calls one real report makes; the issue's 26 stays / 16 returns came from a "
        "static walk of the source over every branch, so the two are not the same measure.",
        "",
        "| tree | kind | carrying calls | stays | files | returns |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, rec in records.items():
        for kind in kinds:
            w = rec["walks"].get(kind)
            if w is not None:
                lines.append(
                    f"| {label} ({rec['tree']}) | {kind} | {w['calls']} | {w['stays']} | "
                    f"{w['files']} | {w['returns']} |"
                )
    for label, rec in records.items():
        lines += ["", f"## {label} ({rec['tree']}): the stays, in order", ""]
        for kind in kinds:
            w = rec["walks"].get(kind)
            if w is None:
                continue
            lines += [f"**{kind}**", ""]
            for n, stay in enumerate(w["sequence"], 1):
                mark = " (return)" if stay.get("return") else ""
                lines.append(f"{n}. `{stay['file']}`{mark}: {', '.join(stay['calls'])}")
            lines.append("")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--before-src", help="also walk the phalanx of this src (as 'before')")
    p.add_argument("--label", default="this tree", help="the name of this tree's rows")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "report_walk.md"))
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if args.one:
        print("WALK " + json.dumps(run_one(args.one.split(","))), flush=True)
        return
    records: dict[str, dict[str, Any]] = {}
    if args.before_src:
        records["before"] = walk_tree(Path(args.before_src).resolve(), kinds)
    records[args.label] = walk_tree(REPO / "src", kinds)
    out = Path(args.out)
    out.write_text("\n".join(render(records, kinds)) + "\n")
    out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    for label, rec in records.items():
        for kind, w in rec["walks"].items():
            print(
                f"{label:>10} {kind:>10}: {w['stays']} stays, {w['files']} files, "
                f"{w['returns']} returns"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
