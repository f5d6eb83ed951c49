"""The process tree from each process's ``/proc/<pid>/task/*/children`` (the tree's own files
only) is the tree from every process's parent: a child forked by a thread, a grandchild in a
session of its own, zombies left out, and a kept subtree spared by kill_descendants."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from _helpers import wait_until

from phalanx._internal.engines import process_tree


def _from_every_stat(root: int) -> set[int]:
    return set(process_tree._subtree(process_tree._children(), root))


def test_children_files_give_the_same_tree_and_kill_spares_the_kept_subtree():
    started: list[subprocess.Popen[bytes]] = []

    def spawn(args: list[str]) -> None:
        started.append(subprocess.Popen(args, start_new_session=True))

    spawn(["sh", "-c", "setsid sleep 60 & sleep 60; true"])  # two grandchildren, one setsid
    thread = threading.Thread(target=spawn, args=(["sleep", "60"],))  # a thread's child
    thread.start()
    thread.join()
    kept = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        me = os.getpid()
        wait_until(lambda: len(process_tree.descendants(me)) >= 6, 10, "the tree")
        wait_until(lambda: process_tree._is_live(zombie.pid) is False, 10, "the zombie")
        found = process_tree.descendants(me)
        assert set(found) == _from_every_stat(me) and zombie.pid not in found
        assert {p.pid for p in started} <= set(found) and kept.pid in found
        spared = {kept.pid, *process_tree.descendants(kept.pid)}
        assert len(spared) == 2
        killed = process_tree.kill_descendants(me, frozenset({kept.pid}))
        assert killed and not killed & spared and {p.pid for p in started} <= killed
        assert all(process_tree._is_live(p) for p in spared)
    finally:
        process_tree.kill_descendants(kept.pid)
        for proc in (*started, kept, zombie):
            proc.kill()
            proc.wait()
