"""The sandbox children's scratch directories in the GPU work directory (MARATHON_GPU_WORKDIR), which
outlives a worker and may be shared by the workers of one host: each is named for its role and the worker
process that made it (its pid and, where /proc says, its start time, so that a pid used again, as in a
restarted container, is not taken for the same process), so a worker starting there removes those of
workers that were killed (a stopped one removes its own) and leaves a live neighbour's alone."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

#: role, then the worker process: its pid and, where known, its start time
_NAMED = re.compile(r"^(candidate|reference)-(\d+)(?:\.(\d+))?-")


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat), or None where /proc has none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the command name before it may hold spaces


def owner() -> str:
    """This process, as scratch directories name it."""
    start = _started(os.getpid())
    return f"{os.getpid()}.{start}" if start else str(os.getpid())


def make(role: str, root: Path) -> str:
    """A new scratch directory for a `role` child of this process, under `root`."""
    return tempfile.mkdtemp(prefix=f"{role}-{owner()}-", dir=root)


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    now = _started(pid)
    return start is None or now is None or now == start


def remove_orphans(root: Path) -> list[str]:
    """Removes the scratch directories under `root` whose worker process is gone; returns their names.
    Directories named otherwise (not a worker's) are left."""
    gone = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        m = _NAMED.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and not _alive(int(m.group(2)), m.group(3)):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p.name)
    return gone
