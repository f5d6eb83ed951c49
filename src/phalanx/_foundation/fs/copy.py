"""Copy a local checkpoint directory into local storage, the fastest safe way the platform has.

Each file is copied by the first method that works: a reflink (``ioctl FICLONE``: the new file
shares the old one's blocks until either is written; btrfs, XFS, bcachefs, ZFS 2.2), then
``os.copy_file_range`` (an in-kernel copy, server-side on NFS 4.2), then ``os.sendfile``, then a
plain read/write loop. A method the filesystems refuse is not tried again for that pair of devices.

Nothing here fsyncs: the driver fsyncs every committed checkpoint before it becomes visible, so
one flush covers every rank's files (see ``RunStorage.commit``).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import stat

logger = logging.getLogger(__name__)

__all__ = ["copy_file", "copy_tree"]

FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h
_CHUNK = 1 << 30  # copy_file_range / sendfile per call; the kernel caps it at ~2 GiB anyway
# Errors that mean "this method is not available here", not "the copy failed".
_UNSUPPORTED = {
    errno.EOPNOTSUPP,
    errno.ENOTTY,
    errno.EXDEV,
    errno.EINVAL,
    errno.ENOSYS,
    errno.EBADF,
    errno.ETXTBSY,
    getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
}
# (method, (source device, target device)) -> the filesystem refused that method once
_refused: dict[tuple[str, tuple[int, int]], bool] = {}


def copy_file(src: str, dst: str) -> str:
    """Copy the regular file ``src`` to ``dst`` (created or truncated, mode kept); return the
    method that did it: ``reflink``, ``copy_file_range``, ``sendfile`` or ``read_write``."""
    with open(src, "rb") as fin:
        info = os.fstat(fin.fileno())
        with open(dst, "wb") as fout:
            method = _copy_fd(fin.fileno(), fout.fileno(), info)
    os.chmod(dst, stat.S_IMODE(info.st_mode))
    return method


def _copy_fd(fd_in: int, fd_out: int, info: os.stat_result) -> str:
    size, dev = info.st_size, (info.st_dev, os.fstat(fd_out).st_dev)
    if size == 0:
        return "read_write"
    if not _refused.get(("reflink", dev)):
        try:
            fcntl.ioctl(fd_out, FICLONE, fd_in)
            return "reflink"
        except OSError as exc:
            _give_up("reflink", dev, exc)
    for method, call in (("copy_file_range", _copy_file_range), ("sendfile", _sendfile)):
        if _refused.get((method, dev)) or not hasattr(os, method):
            continue
        try:
            if call(fd_in, fd_out, size):
                return method
        except OSError as exc:
            _give_up(method, dev, exc)
        os.lseek(fd_in, 0, os.SEEK_SET)  # a refused method may have moved nothing; start over
        os.ftruncate(fd_out, 0)
        os.lseek(fd_out, 0, os.SEEK_SET)
    with open(fd_in, "rb", closefd=False) as fin, open(fd_out, "wb", closefd=False) as fout:
        shutil.copyfileobj(fin, fout, 16 << 20)
    return "read_write"


def _give_up(method: str, dev: tuple[int, int], exc: OSError) -> None:
    if exc.errno not in _UNSUPPORTED:
        raise exc
    _refused[(method, dev)] = True
    logger.debug(
        "%s is not available for devices %s (%s); trying the next method", method, dev, exc
    )


def _copy_file_range(fd_in: int, fd_out: int, size: int) -> bool:
    done = 0
    while done < size:
        n = os.copy_file_range(fd_in, fd_out, min(_CHUNK, size - done))
        if n == 0:  # the source shrank under us, or the filesystem copies nothing: fall back
            return done == size
        done += n
    return True


def _sendfile(fd_in: int, fd_out: int, size: int) -> bool:
    done = 0
    while done < size:
        n = os.sendfile(fd_out, fd_in, done, min(_CHUNK, size - done))
        if n == 0:
            return done == size
        done += n
    return True


def copy_tree(src: str, dst: str, exclude: str | None = None) -> int:
    """Copy every entry of directory ``src`` into ``dst`` (created; existing files overwritten).

    Symbolic links are followed (the checkpoint gets the data, not a link that may dangle).
    Sockets, FIFOs and device files are skipped with a warning: they are no checkpoint data
    (a shared directory such as ``/tmp`` has them). ``exclude``: an absolute path under ``src``
    that is not copied (the storage path, when it lives inside the checkpoint directory).
    Returns the number of files copied.
    """
    os.makedirs(dst, exist_ok=True)
    copied = 0
    skipped: list[str] = []
    for entry in list(os.scandir(src)):  # list(): closed at once, even if the loop raises
        if exclude is not None and os.path.abspath(entry.path) == exclude:
            continue
        target = os.path.join(dst, entry.name)
        if entry.is_dir():
            copied += copy_tree(entry.path, target, exclude)
        elif entry.is_file():
            copy_file(entry.path, target)
            copied += 1
        else:
            skipped.append(entry.name)
    if skipped:
        logger.warning(
            "Not copied into the checkpoint (not regular files or directories) from %s: %s",
            src,
            ", ".join(sorted(skipped)[:10]) + (" ..." if len(skipped) > 10 else ""),
        )
    return copied
