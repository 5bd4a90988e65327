"""Atomic file writes: write to a temporary sibling, fsync, then rename over the target.

Unfinished outputs carry their writer's pid in their name (`<name>.partial-<pid>...`, `.<name>.tmp-<pid>-...`),
so the next run can tell the leftovers of a writer that was killed (removed by `clean_partials`) from the
work of one still running (kept).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np


class NoSpaceError(OSError):
    """Not enough room on the filesystem for what a writer is about to write (checked before it writes, or found
    when the disk filled): nothing it was replacing has been touched."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.strerror)


def free_bytes(path: Path) -> int:
    """Free bytes (for this user) on the filesystem that holds `path`, or would hold it once created."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_room(folder: Path, needed: int, what: str) -> None:
    """Raise NoSpaceError naming `folder`, the bytes needed and the bytes free, unless `needed` bytes fit."""
    free = free_bytes(folder)
    if needed > free:
        raise NoSpaceError(f"{folder}: {what} needs about {needed:,} bytes; {free:,} are free there")


def is_disk_full(err: OSError) -> bool:
    return err.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(err)


@contextmanager
def reported_disk_full(folder: Path, what: str) -> Iterator[None]:
    """A disk that fills inside the block becomes a NoSpaceError naming `folder`, what was being written and the
    bytes free (after the writer's own clean-up, when the block holds it)."""
    try:
        yield
    except OSError as err:
        if isinstance(err, NoSpaceError) or not is_disk_full(err):
            raise
        free = free_bytes(folder)
        raise NoSpaceError(f"{folder}: the disk filled while writing {what}; {free:,} bytes are free there") from err


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_PARTIAL = re.compile(r"\.(?:partial|tmp)-(\d+)(?:-|$)")


def partial_name(name: str) -> str:
    """The name of `name` while this process writes it."""
    return f"{name}.partial-{os.getpid()}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_partials(folder: Path) -> list[Path]:
    """Remove the unfinished outputs in `folder` whose writer process is gone (killed mid-write); returns them."""
    removed = []
    for entry in Path(folder).iterdir() if Path(folder).is_dir() else []:
        match = _PARTIAL.search(entry.name)
        if match and not pid_alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp_path)`, then rename tmp_path to `path`: readers see the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; others on a shared filesystem must read them
    try:
        write(Path(tmp))
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: object) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n"))


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a file object: np.save would append ".npy" to a path
            np.save(handle, array)

    write_atomic(path, write)


def write_dir_atomic(folder: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp_dir)`, then swap tmp_dir in for `folder`: a crash never leaves half a folder in its place."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".partial")
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    fsync_dir(folder.parent)
    shutil.rmtree(old, ignore_errors=True)
