"""Hang detection: ranks that stop making progress, and a roll call of where each one is stuck."""

from __future__ import annotations

import time

from phalanx.errors import HangError, WorkerFailure


class ProgressWatchdog:
    """Progress is a report or the end of the training call; ``hang_timeout_s`` without it on a
    rank that has not finished means that rank is hung. ``None`` turns the watchdog off."""

    def __init__(self, hang_timeout_s: float | None, world_size: int) -> None:
        self.timeout_s = hang_timeout_s
        now = time.monotonic()
        self._last = [now] * world_size

    def start(self) -> None:
        """Training calls were just launched: start every rank's clock."""
        now = time.monotonic()
        self._last = [now] * len(self._last)

    def progress(self, rank: int) -> None:
        self._last[rank] = time.monotonic()

    def idle_s(self) -> dict[int, float]:
        """Seconds since each rank's last progress."""
        now = time.monotonic()
        return {rank: now - last for rank, last in enumerate(self._last)}

    def hung_ranks(self, finished: set[int]) -> list[int]:
        if self.timeout_s is None:
            return []
        now = time.monotonic()
        return [
            rank
            for rank, last in enumerate(self._last)
            if rank not in finished and now - last > self.timeout_s
        ]


# A frame from one of these files means the rank waits for the others in a collective.
COLLECTIVE_FILES = ("torch/distributed/", "xgboost/collective")
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
    timeout_s: float,
    pids: dict[int, int | None],
    idle_s: dict[int, float] | None = None,
) -> HangError:
    failures = {
        rank: WorkerFailure(
            rank,
            "hang",
            "HangError",
            f"no progress for {timeout_s:g} s",
            stacks.get(rank, ""),
            pid=pids.get(rank),
            time=time.time(),
        )
        for rank in hung
    }
    parts = [
        f"Rank(s) {', '.join(map(str, hung))} made no progress (no report(), no return) for "
        f"{timeout_s:g} s (FailureConfig.hang_timeout_s).",
        "Where each rank is:",
        roll_call(stacks, idle_s) if stacks else "  (stacks unavailable on this engine)",
        "HINT: a rank that skipped a collective or a report() stalls the others; if a step can "
        "legitimately take longer, raise hang_timeout_s.",
    ]
    for rank in sorted(stacks):
        parts.append(f"--- rank {rank} ---\n{stacks[rank].rstrip()}")
    return HangError(failures, message="\n".join(parts))
