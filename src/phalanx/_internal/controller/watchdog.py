"""Hang detection: ranks that stop making progress, and a roll call of where each one is stuck."""

from __future__ import annotations

import time

from phalanx._foundation import env
from phalanx.errors import HangError, WorkerFailure

AUTO = "auto"
ROUND_FACTOR = 10  # the default rule: k x the slowest round seen so far...
FIRST_ROUND_FACTOR = 4  # ...and before any report, this many floors (compilation, data loading)


class ProgressWatchdog:
    """Progress is a report or the end of the training call; a rank that has not finished and
    makes none within the bound is hung. ``None`` or ``0`` turns the watchdog off; a number is a
    fixed bound; ``"auto"`` is the default rule: the larger of ``floor_s`` and ROUND_FACTOR x
    the slowest round seen so far (a rank's first round excluded), and FIRST_ROUND_FACTOR x
    ``floor_s`` until some rank has reported."""

    def __init__(
        self, hang_timeout_s: float | str | None, world_size: int, floor_s: float | None = None
    ) -> None:
        self.auto = hang_timeout_s == AUTO
        self.fixed_s = None if self.auto or not hang_timeout_s else float(hang_timeout_s)
        self.floor_s = env.hang_timeout_floor_s() if floor_s is None else floor_s
        self.slowest_round_s = 0.0
        now = time.monotonic()
        self._last = [now] * world_size
        self._reports = [0] * world_size

    def start(self) -> None:
        """Training calls were just launched: start every rank's clock."""
        now = time.monotonic()
        self._last = [now] * len(self._last)

    def progress(self, rank: int) -> None:
        now = time.monotonic()
        if self._reports[rank]:  # a first round holds compilation and data loading: not a pace
            self.slowest_round_s = max(self.slowest_round_s, now - self._last[rank])
        self._reports[rank] += 1
        self._last[rank] = now

    def idle_s(self) -> dict[int, float]:
        """Seconds since each rank's last progress."""
        now = time.monotonic()
        return {rank: now - last for rank, last in enumerate(self._last)}

    def bound_s(self) -> float | None:
        """How long a rank may go without progress now (None: never hung)."""
        if not self.auto:
            return self.fixed_s
        if not any(self._reports):
            return FIRST_ROUND_FACTOR * self.floor_s
        return max(self.floor_s, ROUND_FACTOR * self.slowest_round_s)

    def hung_ranks(self, finished: set[int]) -> list[int]:
        bound = self.bound_s()
        if bound is None:
            return []
        now = time.monotonic()
        over = [
            rank
            for rank, last in enumerate(self._last)
            if rank not in finished and now - last > bound
        ]
        # Under the default rule a rank that never reported while others do (rank-0-only
        # reporting) shows no pace to judge: it is named only along with a rank that reports.
        if self.auto and any(self._reports) and not any(self._reports[r] for r in over):
            return []
        return over

    def rule(self) -> str:
        """The bound in force and where it comes from, for the hang error."""
        bound = self.bound_s() or 0.0
        if not self.auto:
            return f"{bound:g} s (FailureConfig.hang_timeout_s)"
        if not any(self._reports):
            how = f"before any report: {FIRST_ROUND_FACTOR}x the floor of {self.floor_s:g} s"
        else:
            how = (
                f"the larger of the floor, {self.floor_s:g} s, and {ROUND_FACTOR}x the slowest "
                f"round so far, {self.slowest_round_s:.3g} s"
            )
        return (
            f"{bound:g} s (the default rule, hang_timeout_s='auto': {how}; "
            f"{env.HANG_FLOOR_VAR} sets the floor)"
        )


# A frame from one of these files means the rank waits for the others in a collective: called
# directly (torch.distributed, XGBoost's), or inside DDP's forward (its buffer broadcast) and
# inside backward, where DDP's and FSDP's reducer hooks run the gradient allreduce and the
# autograd engine waits for it (``_engine_run_backward``, ``Variable._execution_engine``).
COLLECTIVE_FILES = (
    "torch/distributed/",
    "torch/nn/parallel/distributed.py",
    "torch/autograd/graph.py",
    "xgboost/collective",
)
IDLE_MARGIN_S = 1.0  # ranks idle this much longer than the rest stopped first


def _training_block(stack: str) -> str:
    blocks = stack.split("\n\n") if "\n\n" in stack else [stack]
    return next((b for b in blocks if "run_train_fn" in b), stack)


def innermost_user_frame(stack: str) -> str:
    """The frame where the training thread is, from a faulthandler or traceback dump."""
    block = _training_block(stack)
    frames = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
    if not frames:
        return "(no Python stack)"
    most_recent_first = "most recent call first" in block
    return frames[0] if most_recent_first else frames[-1]


def in_collective(stack: str) -> bool:
    """Whether the training thread waits in a collective (torch.distributed, ...)."""
    block = _training_block(stack)
    return any(
        line.strip().startswith("File ") and any(f in line for f in COLLECTIVE_FILES)
        for line in block.splitlines()
    )


def stopped_ranks(stacks: dict[int, str], idle_s: dict[int, float]) -> tuple[list[int], str]:
    """The ranks that stopped the others, and why we think so ([] when none stands out).

    A rank outside a collective while others wait in one is the one they wait for; else the
    ranks whose last report is clearly the oldest; else the one frame fewer ranks share."""
    waiting = sorted(r for r, stack in stacks.items() if in_collective(stack))
    if waiting and len(waiting) < len(stacks):
        label = ", ".join(map(str, waiting))
        return sorted(set(stacks) - set(waiting)), f"Rank {label} wait in a collective for it."
    idle = {r: idle_s[r] for r in stacks if r in idle_s}
    if idle:
        oldest = max(idle.values())
        first = sorted(r for r, s in idle.items() if s > oldest - IDLE_MARGIN_S)
        if len(first) < len(idle):
            return first, f"Its last progress is the oldest ({oldest:.1f} s ago)."
    groups: dict[str, list[int]] = {}
    for rank, stack in sorted(stacks.items()):
        groups.setdefault(innermost_user_frame(stack), []).append(rank)
    sizes = sorted(len(g) for g in groups.values())
    if len(sizes) > 1 and sizes[0] < sizes[1]:
        return min(groups.values(), key=len), "Fewer ranks are there than anywhere else."
    return [], ""


def roll_call(stacks: dict[int, str], idle_s: dict[int, float] | None = None) -> str:
    """Group ranks by the frame they are in, and name the rank(s) that stopped."""
    groups: dict[str, list[int]] = {}
    for rank, stack in sorted(stacks.items()):
        groups.setdefault(innermost_user_frame(stack), []).append(rank)
    lines = []
    for frame, ranks in sorted(groups.items(), key=lambda item: len(item[1])):
        lines.append(f"  [rank {', '.join(map(str, ranks))}] {frame}")
    odd, why = stopped_ranks(stacks, idle_s or {})
    if odd and len(groups) > 1:
        lines.append(f"  -> rank {', '.join(map(str, odd))} is not where the others are. {why}")
    elif odd:
        lines.append(f"  -> rank {', '.join(map(str, odd))} stopped first. {why}")
    return "\n".join(lines)


def hang_error(
    hung: list[int],
    stacks: dict[int, str],
    rule: str,
    pids: dict[int, int | None],
    idle_s: dict[int, float] | None = None,
) -> HangError:
    """``rule``: the bound that was passed and where it comes from (``ProgressWatchdog.rule``)."""
    bound = rule.split(" (", 1)[0]
    failures = {
        rank: WorkerFailure(
            rank,
            "hang",
            "HangError",
            f"no progress for {bound}",
            stacks.get(rank, ""),
            pid=pids.get(rank),
            time=time.time(),
        )
        for rank in hung
    }
    parts = [
        f"Rank(s) {', '.join(map(str, hung))} made no progress (no report(), no return) for "
        f"{rule}.",
        "Where each rank is:",
        roll_call(stacks, idle_s) if stacks else "  (stacks unavailable on this engine)",
        "HINT: a rank that skipped a collective or a report() stalls the others; if a step can "
        "legitimately take longer, set FailureConfig(hang_timeout_s=<seconds>) (None turns the "
        "watchdog off).",
    ]
    for rank in sorted(stacks):
        parts.append(f"--- rank {rank} ---\n{stacks[rank].rstrip()}")
    return HangError(failures, message="\n".join(parts))
