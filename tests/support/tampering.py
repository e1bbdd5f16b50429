"""Editing a written checkpoint as whoever can write its storage would: ``_metadata`` as a JSON
document, a RocksDB manifest with its checksum sealed again and its size and CRC32C updated in
``_metadata`` (so that only the edit itself can be refused)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import google_crc32c
import msgspec

from streamstate.backends.rocksdb.incremental import MANIFEST_KIND, IncrementalManifest
from streamstate.checkpoint.storage import METADATA_FILE, CheckpointStorage


def metadata_doc(storage: CheckpointStorage, directory: str) -> dict[str, Any]:
    return json.loads(storage.read_bytes(f"{directory}/{METADATA_FILE}"))  # type: ignore[no-any-return]


def put_metadata_doc(storage: CheckpointStorage, directory: str, doc: dict[str, Any]) -> None:
    storage.put_atomic(f"{directory}/{METADATA_FILE}", json.dumps(doc, indent=1).encode())


def edit_metadata(
    storage: CheckpointStorage, directory: str, edit: Callable[[dict[str, Any]], None]
) -> None:
    doc = metadata_doc(storage, directory)
    edit(doc)
    put_metadata_doc(storage, directory, doc)


def subtask_docs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for op in doc["operators"].values() for s in op["subtasks"]]


def manifest_handles(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``_metadata`` handles of every RocksDB manifest, subtask by subtask."""
    return [h for s in subtask_docs(doc) for h in s["keyed"] if h["kind"] == MANIFEST_KIND]


def _resolved(directory: str, path: str) -> str:
    import posixpath

    return posixpath.normpath(posixpath.join(directory, path))


def edit_manifest(
    storage: CheckpointStorage,
    directory: str,
    edit: Callable[[IncrementalManifest], IncrementalManifest],
    index: int = 0,
) -> IncrementalManifest:
    """Replace the ``index``-th manifest of checkpoint ``directory`` by ``edit(manifest)``,
    sealed again (checksum), with its size and CRC32C updated in ``_metadata``; returns the
    edited manifest."""
    doc = metadata_doc(storage, directory)
    handle = manifest_handles(doc)[index]
    path = _resolved(directory, handle["path"])
    manifest = IncrementalManifest.decode(storage.read_bytes(path), path)
    edited = edit(manifest)
    data = edited.encode()
    storage.put_atomic(path, data)
    handle["size"] = len(data)
    handle["checksum"] = google_crc32c.value(data)
    put_metadata_doc(storage, directory, doc)
    return edited


def replaced(struct: Any, **changes: Any) -> Any:
    return msgspec.structs.replace(struct, **changes)
