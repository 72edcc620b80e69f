"""Files of the token cache that several runs share: atomic writes (a reader sees no file or a whole one) and
an exclusive lock per entry (the runs of a parallel sweep tokenize once). Used by the cache and by the
tokenizers it trains."""

from __future__ import annotations

import contextlib
import io
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def write_atomic(path: Path, write: Callable[[io.BufferedWriter], Any]) -> None:
    """Write to a unique temp name in the same folder, then rename: readers see no file or a whole one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive advisory lock so the runs of a parallel sweep tokenize once; a no-op where flock is missing.

    Correctness never depends on it (writes are atomic and deterministic); it only saves duplicate work. The
    kernel releases it when its holder dies, even by kill -9. The holder removes the lock file before
    releasing it, so no ``.lock`` outlives the work it guarded (a refused run used to leave one per attempt): a
    waiter woken on the removed file sees that ``path`` is no longer that file and locks the current one."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    while True:
        f = open(path, "a")  # noqa: SIM115 (closed below, once the lock is released or found stale)
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks: fall back to racing, which is safe
            f.close()
            yield
            return
        if _same_file(f, path):
            break
        f.close()  # its holder removed it while we waited: lock the file that is there now
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def _same_file(f: Any, path: Path) -> bool:
    try:
        here, there = os.fstat(f.fileno()), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
