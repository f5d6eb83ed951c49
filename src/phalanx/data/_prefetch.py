"""Run a batch producer in a background thread, a bounded number of batches ahead.

The thread (``phalanx-prefetch``) puts batches on a bounded queue, so memory stays bounded
whatever the data size. Small batches travel in bundles (growing from one batch to about
``BUNDLE_BYTES``) so the hand-off costs little per batch and the first batch comes at once.
The thread stops when the iteration ends, fails, or is abandoned (the generator is closed or
garbage-collected): it checks a stop event between bounded waits and is joined.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["prefetched"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

BUNDLE_BYTES = 4 << 20
PUT_WAIT_S = 0.05
JOIN_TIMEOUT_S = 10.0
_END = object()


def prefetched(
    produce: Callable[[], Iterator[T]],
    depth: int,
    size_of: Callable[[T], int] = lambda _: BUNDLE_BYTES,
) -> Iterator[T]:
    """Iterate ``produce()`` with up to ``depth`` bundles prepared ahead (``depth=0``: inline).

    ``size_of(batch)`` estimates a batch's bytes; a bundle holds one batch or more, up to
    ``BUNDLE_BYTES``, so the batches held in memory are about ``depth + 1`` bundles."""
    if depth <= 0:
        yield from produce()
        return
    channel: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    thread = threading.Thread(
        target=_run, args=(produce, channel, stop, size_of), name="phalanx-prefetch", daemon=True
    )
    thread.start()
    try:
        while True:
            item = channel.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield from item
    finally:
        stop.set()
        _drain(channel)
        thread.join(JOIN_TIMEOUT_S)
        if thread.is_alive():  # pragma: no cover - a read stuck in storage
            logger.warning("The prefetch thread did not stop within %.0f s.", JOIN_TIMEOUT_S)


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _run(
    produce: Callable[[], Iterator[Any]],
    channel: queue.Queue[Any],
    stop: threading.Event,
    size_of: Callable[[Any], int],
) -> None:
    bundle: list[Any] = []
    size, limit = 0, 1  # the first bundle is one batch: the first batch comes at once
    try:
        items = produce()
        try:
            for item in items:
                bundle.append(item)
                size += size_of(item)
                if len(bundle) >= limit or size >= BUNDLE_BYTES:
                    if not _put(channel, bundle, stop):
                        return
                    bundle, size, limit = [], 0, limit * 2
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        if bundle and not _put(channel, bundle, stop):
            return
        _put(channel, _END, stop)
    except BaseException as exc:
        _put(channel, _Failure(exc), stop)


def _put(channel: queue.Queue[Any], item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            channel.put(item, timeout=PUT_WAIT_S)
            return True
        except queue.Full:
            continue
    return False


def _drain(channel: queue.Queue[Any]) -> None:
    while True:
        try:
            channel.get_nowait()
        except queue.Empty:
            return
