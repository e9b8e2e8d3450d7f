"""Content-addressed artifact store: kernel sources, logs, notebooks, prompts, profiles.

Workflow history carries only the sha256 keys this store hands out. Objects are written to a temp
file and renamed into place, so a crash or a full disk never leaves a half-written object under a key;
identical content is stored once. The root is a directory (a shared file system when workers sit on
several hosts): `MARATHON_ARTIFACTS`, default `artifacts` in MARATHON_HOME (`~/.marathon`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def candidate_id(source: str) -> str:
    """A candidate's id: the first 16 hex digits of its source's artifact key."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class ArtifactStoreError(RuntimeError):
    """The store cannot be written or read (full, read-only, missing object)."""


def default_root(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("MARATHON_ARTIFACTS"):
        return Path(env["MARATHON_ARTIFACTS"])
    return Path(env.get("MARATHON_HOME") or Path.home() / ".marathon") / "artifacts"


class ArtifactStore:
    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root) if root else default_root()

    def _path(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ArtifactStoreError(f"not an artifact key: {key!r}")
        return self.root / "objects" / key[:2] / key[2:]

    def path(self, key: str) -> Path:
        p = self._path(key)
        if not p.is_file():
            objects = self.root / "objects"
            if objects.exists() and not objects.is_dir():
                raise ArtifactStoreError(f"artifact store {self.root} is unusable: {objects} is not a directory")
            raise ArtifactStoreError(f"artifact {key[:12]} not found under {self.root}")
        return p

    def put_bytes(self, data: bytes) -> str:
        key = hashlib.sha256(data).hexdigest()
        dest = self._path(key)
        if dest.is_file():
            return key
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            # The temp file is named relative to its folder's descriptor, so that it is removed on failure
            # wherever the folder went meanwhile (moved or replaced by a file: its old path no longer reaches it).
            folder = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                name = f".tmp-{secrets.token_hex(8)}"
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=folder)
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(dest.parent / name, dest)  # by path: the object must land where the store is
                except BaseException:
                    try:
                        os.unlink(name, dir_fd=folder)
                    except FileNotFoundError:
                        pass
                    raise
            finally:
                os.close(folder)
        except OSError as e:
            raise ArtifactStoreError(f"artifact store {self.root} is not writable: {e.strerror or e}") from e
        return key

    def put_text(self, text: str) -> str:
        return self.put_bytes(text.encode())

    def put_json(self, obj: Any) -> str:
        return self.put_bytes(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())

    def get_bytes(self, key: str) -> bytes:
        data = self.path(key).read_bytes()
        if hashlib.sha256(data).hexdigest() != key:
            raise ArtifactStoreError(f"artifact {key[:12]} is corrupt (content does not match its key)")
        return data

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode()

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def exists(self, key: str) -> bool:
        try:
            return self._path(key).is_file()
        except ArtifactStoreError:
            return False

    def verify_all(self) -> list[str]:
        """Keys whose content no longer matches (used by the soak test's consistency check)."""
        bad = []
        for p in (self.root / "objects").glob("*/*"):
            key = p.parent.name + p.name
            if hashlib.sha256(p.read_bytes()).hexdigest() != key:
                bad.append(key)
        return bad
