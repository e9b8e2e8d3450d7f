"""The sandbox children's scratch directories in the GPU work directory (MARATHON_GPU_WORKDIR), which
outlives a worker and may be shared by the workers of one host: each is named for its role and the worker
process that made it, so a worker starting there removes those of workers that were killed (a stopped one
removes its own) and leaves a live neighbour's alone."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

#: role, then the pid of the worker process that made the directory
_NAMED = re.compile(r"^(candidate|reference)-(\d+)-")


def make(role: str, root: Path) -> str:
    """A new scratch directory for a `role` child of this process, under `root`."""
    return tempfile.mkdtemp(prefix=f"{role}-{os.getpid()}-", dir=root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_orphans(root: Path) -> list[str]:
    """Removes the scratch directories under `root` whose worker process is gone; returns their names.
    Directories named otherwise (not a worker's) are left."""
    gone = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        m = _NAMED.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and not _alive(int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p.name)
    return gone
