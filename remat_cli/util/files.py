"""Writing output files: atomically where the path is a regular file, in place where it is not;
and pointing a descriptor nobody reads at /dev/null.

Below the commands, the watchdog and the runtime's exporter, which all write where the user says.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

#: paths that name one of the process's own descriptors (a regular file under /dev/shm is not one)
STREAMS = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/")


def write_atomic(path: str, data: str | bytes) -> None:
    """Write via a temp file in the same folder and rename, so a failed run never truncates.

    A symbolic link is followed: its target is replaced, the link stays. A path that is not a
    regular file (``-o /dev/stdout``, ``-o /dev/null``, a shell's ``-o >(jq .)``) is written in
    place: a rename replaced the device node itself (run as root, ``-o /dev/null`` left a
    regular file at /dev/null and every later ``> /dev/null`` filled it)."""
    if isinstance(data, str):
        data = (data if data.endswith("\n") else data + "\n").encode()
    if in_place(path):
        with open(path, "wb") as f:
            f.write(data)
        return
    target = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def in_place(path: str) -> bool:
    """Whether `path` is written in place (:func:`write_atomic`): it exists and is no regular
    file, or it is one of the process's own streams (/dev/stdout, /proc/self/fd/N: where stdout
    is a file, replacing that file would detach it from the shell's redirection)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) or os.path.abspath(path).startswith(STREAMS)


def to_devnull(fd: int) -> None:
    """Point descriptor `fd` at /dev/null: its reader has gone (a closed pipe), or nobody may
    write to it (a solver's child process and stdout)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
