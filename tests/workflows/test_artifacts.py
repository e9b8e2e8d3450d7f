"""The artifact store: an object appears whole under its key or not at all, and a failed write leaves no
temp file behind, wherever its folder went meanwhile."""

from __future__ import annotations

import hashlib
import os

import pytest

from workflows.artifacts import ArtifactStore, ArtifactStoreError


def test_an_object_is_stored_once_under_its_key(store):
    key = store.put_text("def run(inputs, out):\n    pass\n")
    assert key == hashlib.sha256(b"def run(inputs, out):\n    pass\n").hexdigest()
    assert store.put_text("def run(inputs, out):\n    pass\n") == key
    assert store.get_text(key).startswith("def run") and store.verify_all() == []
    assert [p.name for p in (store.root / "objects").rglob("*") if p.is_file()] == [key[2:]]


@pytest.mark.parametrize("replaced_by", ["file", "nothing"])
def test_a_folder_gone_between_the_write_and_the_rename_leaves_no_temp_file(store, monkeypatch, replaced_by):
    """The store's objects folder is moved away (and a file put in its place, or nothing) after the temp file
    is written and before it is renamed into place: the put fails in one clear error, and the temp file is
    removed from the folder where it now lies."""
    objects, moved = store.root / "objects", store.root / "objects.saved"
    store.put_text("first")  # the objects folder exists
    real_replace = os.replace

    def folder_moves_first(src, dst, **kw):
        objects.rename(moved)
        if replaced_by == "file":
            objects.write_text("not a directory")
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", folder_moves_first)
    with pytest.raises(ArtifactStoreError, match="is not writable"):
        store.put_text("second")
    monkeypatch.setattr(os, "replace", real_replace)
    left = [p.name for p in moved.rglob("*") if p.is_file()]
    assert len(left) == 1 and not any(n.startswith(".tmp-") for n in left), left
    if objects.is_file():
        objects.unlink()
    moved.rename(objects)
    assert ArtifactStore(store.root).verify_all() == []
