"""The harness every comparative benchmark here runs on, so a script keeps only its workload.

A benchmark script defines a ``Bench`` (its systems, its workload's arguments, how one system runs,
what its report says; ``Bench.of`` takes ``run_one``, ``add_arguments``, ``workload`` and
``report`` from the script's functions of those names) and calls ``main(BENCH)``. The harness then:

- runs ``--reps`` repetitions, interleaved (rep 0 of every system, then rep 1, ...), each run
  in a fresh subprocess of the same script (``--one SYSTEM``) with one thread per worker, and
  optionally in a session of its own, or with every process it starts marked, whose leftover
  processes are counted and killed; a script whose runs are a plan (system x case x size) names
  them itself (``named_by_workload``), and one that watches its runs from outside (a sampler of
  /proc) passes an ``observer``;
- forwards the workload's arguments to every run, gives it an empty ``--work-dir`` (removed
  after the run) and reads its record back from ``--json-out``;
- writes ``bench/results/<name>.json`` (every run, and the machine/versions/arguments) and
  ``<name>.md``: a header (date, command, machine, load, versions, workload, reps), the script's
  tables and notes, and one line per failed run; ``--render JSON`` rewrites the markdown.

``table`` and ``ratio_table`` give the usual median (min..max) and paired-ratio tables.
Scripts run as ``python bench/<name>.py``, so this module is importable as ``harness``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from common import MARKER_ENV, machine, median, package_version, reap_marked, reap_session, versions

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
Record = dict[str, Any]
# The harness's own arguments: never forwarded to a run, never part of the workload.
LAUNCHED_AT_ENV = "PHALANX_BENCH_LAUNCHED_AT"
"""``time.time()`` when the harness started the run's subprocess (for launch-to-ready times)."""
_OWN = {"systems", "reps", "timeout", "out", "one", "json_out", "work_dir", "render"}


class Observer(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def derive(self, rec: Record) -> Record: ...


@dataclass(frozen=True)
class Bench:
    name: str
    """Results go to bench/results/<name>.{md,json}."""
    title: str
    systems: Sequence[str]
    run_one: Callable[[argparse.Namespace], Record | None]
    """One system's run, in the fresh subprocess (``args.one``, ``args.work_dir``, the workload's
    arguments). None: this process writes no record (e.g. rank 1 of Lightning's launcher)."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """The workload's arguments; each is forwarded to every run and recorded in the results."""
    workload: Callable[[Record], list[str]]
    """The header's lines about the workload (given the results' meta)."""
    report: Callable[[list[Record], Record], list[str]]
    """The markdown after the header: tables, ratios, notes."""
    summary_keys: Sequence[str] = ()
    """What the progress line prints for each run."""
    ok: Callable[[Record], bool] = lambda rec: True
    """Whether a run that exited 0 and wrote its record succeeded."""
    extra_versions: Sequence[str] = ()
    reps: int = 3
    timeout_s: float = 900.0
    own_session: bool = False
    """Start each run in a session of its own; kill (and record) what it leaves behind."""
    marked: bool = False
    """Mark every process a run starts (``common.MARKER_ENV``), however it detaches (Ray's
    daemons start sessions of their own); kill (and record) the marked ones left after it."""
    digits: int = 2
    run_env: Callable[[str, argparse.Namespace], dict[str, str]] = lambda name, args: {}
    """Extra environment variables of one run (given its name and the arguments)."""
    observer: Callable[[str, argparse.Namespace], Observer] | None = None
    """Given the run's marker (``marked``) and the arguments, watches the run from this process: started before
    the run's subprocess, stopped once it exited, then ``derive`` turns the record the run wrote
    into the one kept (e.g. with what a sampler of /proc saw)."""
    named_by_workload: bool = False
    """The runs' names are built by the script from its workload's arguments (e.g.
    ``phalanx@local:64:sync``), so ``--one`` takes any name, not only one of ``systems``."""
    env: dict[str, str] = field(default_factory=lambda: dict(THREAD_ENV))

    @classmethod
    def of(cls, script: ModuleType, **fields: Any) -> Bench:
        """The Bench of a script that defines the usual four functions, ``run_one``,
        ``add_arguments``, ``workload`` and ``report``; ``fields`` are the rest (name, title,
        systems, ...). A script calls it as ``harness.Bench.of(sys.modules[__name__], ...)``."""
        return cls(
            run_one=script.run_one,
            add_arguments=script.add_arguments,
            workload=script.workload,
            report=script.report,
            **fields,
        )


# --------------------------------------------------------------------------- tables


def vals(runs: list[Record], system: str, key: str) -> dict[int, float]:
    """``key`` of each ok run of ``system``, by rep."""
    return {r["rep"]: r[key] for r in runs if r["system"] == system and r["ok"] and key in r}


def cell(runs: list[Record], system: str, key: str, digits: int = 2) -> str:
    v = list(vals(runs, system, key).values())
    if not v:
        return "-"
    return f"{median(v):.{digits}f} ({min(v):.{digits}f}..{max(v):.{digits}f})"


def ratio(runs: list[Record], key: str, a: str, b: str) -> str:
    """The median over reps of (rep i of ``a`` / rep i of ``b``): pairs share the machine's mood."""
    va, vb = vals(runs, a, key), vals(runs, b, key)
    ratios = [va[k] / vb[k] for k in va.keys() & vb.keys() if vb[k] > 0]
    return f"{median(ratios):.3f}x" if ratios else "-"


def table(
    runs: list[Record], systems: Sequence[str], columns: Sequence[tuple[str, str]], digits: int = 2
) -> list[str]:
    """A row per system: ok runs, then median (min..max) of each (key, label) column."""
    lines = [
        "| system | ok | " + " | ".join(label for _, label in columns) + " |",
        "| --- " * (len(columns) + 2) + "|",
    ]
    for s in systems:
        ok = sum(1 for r in runs if r["system"] == s and r["ok"])
        total = sum(1 for r in runs if r["system"] == s)
        cells = " | ".join(cell(runs, s, key, digits) for key, _ in columns)
        lines.append(f"| {s} | {ok}/{total} | {cells} |")
    return lines


def ratio_table(
    runs: list[Record], pairs: Sequence[tuple[str, str]], columns: Sequence[tuple[str, str]]
) -> list[str]:
    if not pairs:
        return []
    lines = ["Ratios: median over reps of (rep i of one / rep i of the other).", ""]
    lines.append("| metric | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |")
    lines.append("| --- " * (len(pairs) + 1) + "|")
    for key, label in columns:
        lines.append(f"| {label} | " + " | ".join(ratio(runs, key, a, b) for a, b in pairs) + " |")
    return lines


def pairs_of(systems: Sequence[str], wanted: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The wanted (a, b) pairs whose systems both ran."""
    return [(a, b) for a, b in wanted if a in systems and b in systems]


# --------------------------------------------------------------------------- results


def header(bench: Bench, meta: Record) -> list[str]:
    m, v = meta["machine"], meta["versions"]
    names = ", ".join(f"{k} {v[k]}" for k in ("torch", "ray", *bench.extra_versions, "phalanx"))
    return [
        f"# {bench.title}",
        "",
        f"- date: {meta['date']}; command: `{meta['command']}`",
        f"- machine: {m['nproc']} CPUs, {m['memory_gib']} GiB, {m['cpu_model']}; load avg "
        f"{m['load_start']:.2f} at start, {m.get('load_end', float('nan')):.2f} at end",
        f"- versions: Python {v['python']}, {names}",
        *bench.workload(meta),
        f"- {meta['reps']} reps, interleaved ({' '.join(meta['systems'])}), each run in its own "
        "subprocess. Median (min..max) of the ok runs.",
        "",
    ]


def write_results(bench: Bench, runs: list[Record], meta: Record, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    render(bench, runs, meta, out)


def render(bench: Bench, runs: list[Record], meta: Record, out: Path) -> None:
    lines = header(bench, meta) + bench.report(runs, meta)
    lines += [f"- FAILED {r['system']} rep {r['rep']}: {r.get('log_tail', '')[-400:]!r}"
              for r in runs if not r["ok"]]  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- runs


def _forwarded(args: argparse.Namespace, workload: Sequence[str]) -> list[str]:
    argv = []
    for dest in workload:
        value = getattr(args, dest)
        flag = "--" + dest.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:
            argv += [flag, str(value)]
    return argv


def launch(bench: Bench, system: str, rep: int, args: argparse.Namespace, logs: Path) -> Record:
    """One run of ``system`` in a fresh subprocess; its record, with ok, e2e_s (and leftover)."""
    json_out, log = logs / f"{system}-{rep}.json", logs / f"{system}-{rep}.log"
    work = Path(tempfile.mkdtemp(prefix=f"phx-{bench.name}-{system}-"))
    cmd = [sys.executable, str(Path(sys.argv[0]).resolve()), "--one", system, "--json-out", str(json_out),
           "--work-dir", str(work), *_forwarded(args, args.workload)]  # fmt: skip
    marker = uuid.uuid4().hex
    env = dict(os.environ, **bench.env, **bench.run_env(system, args), PYTHONUNBUFFERED="1")
    env[LAUNCHED_AT_ENV] = repr(time.time())
    if bench.marked:
        env[MARKER_ENV] = marker
    observer = bench.observer(marker, args) if bench.observer is not None else None
    if observer is not None:
        observer.start()
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=bench.own_session)  # fmt: skip
        rc = _wait(bench, proc, marker, args.timeout)
    rec: Record = {"system": system, "rep": rep, "e2e_s": time.perf_counter() - t0, "ok": False}
    if observer is not None:
        observer.stop()
    if bench.own_session or bench.marked:
        rec["leftover"] = _leftover(bench, proc, marker)
    shutil.rmtree(work, ignore_errors=True)
    if rc == 0 and json_out.exists():
        written = json.loads(json_out.read_text())
        rec.update(observer.derive(written) if observer is not None else written)
        rec["ok"] = bench.ok(rec)
    if not rec["ok"]:
        rec["log_tail"] = f"rc={rc}: " + log.read_text(errors="replace")[-3000:]
    return rec


def _wait(bench: Bench, proc: subprocess.Popen[bytes], marker: str, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
    except BaseException:  # interrupted: take the run's processes down with us
        proc.kill()
        proc.wait()
        if bench.marked:
            reap_marked(marker, grace_s=0)
        raise


def _leftover(bench: Bench, proc: subprocess.Popen[bytes], marker: str) -> list[str]:
    """What the run left behind, killed: its session's processes, the ones carrying its marker."""
    left = []
    if bench.own_session:
        time.sleep(1.0)  # let what exits on its own do so
        left += reap_session(proc.pid)
    if bench.marked:
        left += reap_marked(marker, grace_s=5.0)
    return left


def _progress(bench: Bench, rec: Record) -> str:
    text = " ".join(f"{k}={rec[k]:.{bench.digits}f}" for k in bench.summary_keys if k in rec)
    if "leftover" in rec:
        text += f" leftover={len(rec['leftover'])}"
    status = "ok" if rec["ok"] else "FAILED"
    return f"[rep {rec['rep']}] {rec['system']:15} {status} {text}"


def run_all(bench: Bench, args: argparse.Namespace) -> None:
    systems = [s for s in args.systems.split(",") if s]
    meta: Record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "versions": {**versions(), **{p: package_version(p) for p in bench.extra_versions}},
        **{dest: getattr(args, dest) for dest in args.workload},
        "reps": args.reps,
        "systems": systems,
    }
    logs = Path(tempfile.mkdtemp(prefix=f"phx-{bench.name}-logs-"))
    runs: list[Record] = []
    try:
        for rep in range(args.reps):
            for system in systems:
                rec = launch(bench, system, rep, args, logs)
                runs.append(rec)
                print(_progress(bench, rec), flush=True)
                if not rec["ok"]:
                    print(rec["log_tail"][-1500:], flush=True)
    finally:
        meta["machine"]["load_end"] = os.getloadavg()[0]
        write_results(bench, runs, meta, Path(args.out))
        shutil.rmtree(logs, ignore_errors=True)
    print(Path(args.out).with_suffix(".md").read_text())


def parse_args(bench: Bench, argv: Sequence[str] | None = None) -> argparse.Namespace:
    doc = sys.modules["__main__"].__doc__
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--systems", default=",".join(bench.systems))
    p.add_argument("--reps", type=int, default=bench.reps)
    p.add_argument("--timeout", type=float, default=bench.timeout_s, help="per run, seconds")
    p.add_argument("--out", default=str(RESULTS / bench.name))
    p.add_argument("--render", metavar="JSON", help="rewrite the markdown from a results JSON")
    choices = None if bench.named_by_workload else bench.systems
    p.add_argument("--one", choices=choices, help=argparse.SUPPRESS)
    p.add_argument("--json-out", help=argparse.SUPPRESS)
    p.add_argument("--work-dir", help=argparse.SUPPRESS)
    before = {a.dest for a in p._actions}
    bench.add_arguments(p)
    args = p.parse_args(argv)
    args.workload = [a.dest for a in p._actions if a.dest not in before and a.dest not in _OWN]
    return args


def main(bench: Bench, args: argparse.Namespace | None = None) -> None:
    args = args if args is not None else parse_args(bench)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        render(bench, data["runs"], data["meta"], Path(args.render).with_suffix(""))
    elif args.one:
        for key, value in bench.env.items():
            os.environ.setdefault(key, value)
        rec = bench.run_one(args)
        if rec is not None:
            Path(args.json_out).write_text(json.dumps(rec))
    else:
        run_all(bench, args)
