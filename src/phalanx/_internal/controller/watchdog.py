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

    def hung_ranks(self, finished: set[int]) -> list[int]:
        if self.timeout_s is None:
            return []
        now = time.monotonic()
        return [
            rank
            for rank, last in enumerate(self._last)
            if rank not in finished and now - last > self.timeout_s
        ]


def innermost_user_frame(stack: str) -> str:
    """The frame where the training thread is, from a faulthandler or traceback dump."""
    blocks = stack.split("\n\n") if "\n\n" in stack else [stack]
    block = next((b for b in blocks if "run_train_fn" in b), stack)
    frames = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
    if not frames:
        return "(no Python stack)"
    most_recent_first = "most recent call first" in block
    return frames[0] if most_recent_first else frames[-1]


def roll_call(stacks: dict[int, str]) -> str:
    """Group ranks by the frame they are in; the smallest group is the likely culprit."""
    groups: dict[str, list[int]] = {}
    for rank, stack in sorted(stacks.items()):
        groups.setdefault(innermost_user_frame(stack), []).append(rank)
    lines = []
    for frame, ranks in sorted(groups.items(), key=lambda item: len(item[1])):
        lines.append(f"  [rank {', '.join(map(str, ranks))}] {frame}")
    if len(groups) > 1:
        odd = min(groups.values(), key=len)
        lines.append(f"  -> rank {', '.join(map(str, odd))} is not where the others are.")
    return "\n".join(lines)


def hang_error(
    hung: list[int], stacks: dict[int, str], timeout_s: float, pids: dict[int, int | None]
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
        roll_call(stacks) if stacks else "  (stacks unavailable on this engine)",
        "HINT: a rank that skipped a collective or a report() stalls the others; if a step can "
        "legitimately take longer, raise hang_timeout_s.",
    ]
    for rank in sorted(stacks):
        parts.append(f"--- rank {rank} ---\n{stacks[rank].rstrip()}")
    return HangError(failures, message="\n".join(parts))
