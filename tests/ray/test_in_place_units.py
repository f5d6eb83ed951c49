"""The actor's side of in-place recovery, without Ray: ending a running call, and the count of
messages sent that tells the driver when the old attempt's last message is in."""

from __future__ import annotations

import pickle
import sys
import threading
import time

import cloudpickle
from _helpers import wait_until

from phalanx._internal.engines.ray.actor import MessageBuffer
from phalanx._internal.engines.ray.call_runner import CallRunner


def returns(buffer: MessageBuffer) -> list[tuple]:
    _, items = buffer.take(0.0)
    return [m for m in map(pickle.loads, items) if m[0] == "ret"]


RELEASE = threading.Event()


def block() -> None:
    RELEASE.wait(30)  # blocks in C: an interrupt waits until it returns


def make_runner(buffer: MessageBuffer) -> CallRunner:
    runner = CallRunner(buffer)
    # Its thread lives as long as the actor's process does (here: this test process); renamed,
    # so the leak check, which looks for phalanx-* threads, leaves it alone.
    runner.thread.name = "test-calls"
    return runner


def in_a_child(test):
    """Run ``test`` in a forked child: a CallRunner's threads live as long as their process (as
    in an actor), so each scenario gets a process of its own."""
    import functools
    import multiprocessing
    import traceback

    @functools.wraps(test)
    def run_in_child() -> None:
        def body(conn) -> None:
            try:
                test()
                conn.send(None)
            except BaseException:  # the child's failure, reported whole to the test
                conn.send(traceback.format_exc())

        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        process = ctx.Process(target=body, args=(child,))
        process.start()
        assert parent.poll(60), "the scenario did not finish in its child within 60 s"
        failure = parent.recv()
        process.join(10)
        if process.is_alive():  # a thread of its own still spins: the failure says why
            process.kill()
        assert failure is None, failure

    return run_in_child


def spin() -> None:
    while True:  # Python code: an interrupt lands at its next instruction
        pass


@in_a_child
def test_a_call_running_python_code_is_ended_and_the_next_call_runs():
    buffer = MessageBuffer()
    runner = make_runner(buffer)
    runner.submit(0, cloudpickle.dumps((spin, (), {})))
    wait_until(lambda: runner._interruptible)
    assert runner.end_current(5.0)
    runner.submit(1, cloudpickle.dumps((sum, ([1, 2],), {})))
    wait_until(lambda: len(returns(buffer)) == 2)
    first, second = returns(buffer)
    assert first[1:3] == (0, False) and first[3].type_name == "AttemptInterrupted"
    assert second[1:] == (1, True, 3)
    assert buffer.sent == 2


@in_a_child
def test_a_call_blocked_in_c_code_is_not_idle_within_the_bound():
    buffer = MessageBuffer()
    runner = make_runner(buffer)
    runner.submit(0, cloudpickle.dumps((block, (), {})))
    wait_until(lambda: runner._interruptible)
    started = time.monotonic()
    assert not runner.end_current(0.3)  # Event.wait blocks in C: the interrupt waits
    assert time.monotonic() - started >= 0.3
    RELEASE.set()
    wait_until(lambda: len(returns(buffer)) == 1)
    assert returns(buffer)[0][2] is False  # it ended as soon as it came back to Python


@in_a_child
def test_ending_an_idle_worker_is_immediate():
    runner = make_runner(MessageBuffer())
    assert runner.end_current(0.0)


def a_traced_call_finishes() -> bool:
    """Whether a call under a trace function (what a debugger or coverage installs) returns."""
    done = threading.Event()

    def run() -> None:
        sys.settrace(lambda *args: None)
        try:
            (lambda: 1)()
        finally:
            sys.settrace(None)
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(20)


@in_a_child
def test_after_calls_ended_or_not_a_traced_call_still_returns():
    """Each call drops an interrupt that did not land. Dropping it with
    PyThreadState_SetAsyncExc(thread, NULL) left CPython's pending signal set, and every traced
    call in the process (a debugger, coverage) then spun forever at its first line."""
    buffer = MessageBuffer()
    runner = make_runner(buffer)
    runner.submit(0, cloudpickle.dumps((sum, ([1, 2],), {})))  # a call that is not interrupted
    runner.submit(1, cloudpickle.dumps((spin, (), {})))
    wait_until(lambda: runner._interruptible and len(returns(buffer)) == 1)
    assert runner.end_current(5.0)
    wait_until(lambda: len(returns(buffer)) == 2)
    assert a_traced_call_finishes()
