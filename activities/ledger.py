"""The run's ledger: every IterationRecord, in chunks written at each compaction. Each chunk names the
previous one, so carried state holds one key however long the run is."""

from __future__ import annotations

from functools import lru_cache

from workflows.artifacts import ArtifactStore
from workflows.contracts import IterationRecord


def append_chunk(store: ArtifactStore, prev: str | None, workflow_id: str, run: int,
                 records: list[IterationRecord]) -> str:
    return store.put_json({"kind": "ledger", "prev": prev, "workflow_id": workflow_id, "run": run,
                           "records": [r.model_dump(mode="json") for r in records]})


@lru_cache(maxsize=4096)
def _chunk(root: str, key: str) -> tuple[str | None, tuple[IterationRecord, ...]]:
    # Content-addressed, so a chunk never changes: safe to cache by key.
    data = ArtifactStore(root).get_json(key)
    return data["prev"], tuple(IterationRecord.model_validate(r) for r in data["records"])


def read_ledger(store: ArtifactStore, head: str | None) -> list[IterationRecord]:
    """All records from the first chunk to `head`, in iteration order."""
    chunks = []
    key = head
    while key:
        prev, recs = _chunk(str(store.root), key)
        chunks.append(recs)
        key = prev
    return [r for recs in reversed(chunks) for r in recs]
