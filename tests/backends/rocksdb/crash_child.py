"""The process that the crash tests kill with SIGKILL (run as a script, never imported by pytest).

Usage: ``crash_child.py MODE WORKDIR CHECKPOINTS``

* ``process``: fill state, complete checkpoints 1 and 2 (each complete once its ``_metadata``
  exists, written last), then keep processing forever.
* ``upload``: complete checkpoint 1, change state, then upload checkpoint 2 through a store that
  stalls in the middle of the SST uploads.
* ``batches``: WAL enabled; flush two states in one WriteBatch per round, forever.

Before a checkpoint is marked complete the child writes what it expects a restore to produce
(every column family's raw entries) next to the metadata; progress lines go to stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time

import msgspec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))

from streamstate import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.backends.rocksdb.storage import CheckpointStorageFileStore
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.keygroups import KeyGroupRange
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer

V = ValueStateDescriptor("v", int)
L = ListStateDescriptor("l", int)
M = MapStateDescriptor("m", int, str)


def say(line: str) -> None:
    print(line, flush=True)


def backend(workdir: str, **config: object) -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(
        Int64Serializer(),
        128,
        KeyGroupRange(0, 127),
        options=RocksDBConfig(write_buffer_size=256 * 1024, **config),  # type: ignore[arg-type]
        path=workdir,
    )


def process(b: RocksDBKeyedStateBackend, first: int, last: int, step: int) -> None:
    v = b.get_partitioned_state(VOID_NAMESPACE, None, V)
    lst = b.get_partitioned_state(VOID_NAMESPACE, None, L)
    m = b.get_partitioned_state(VOID_NAMESPACE, None, M)
    for k in range(first, last):
        b.set_current_key(k % 5000)
        v.update(k * step)
        lst.add(k)
        m.put(k % 7, f"{k}-{step}")


def raw_dump(b: RocksDBKeyedStateBackend) -> bytes:
    b.flush()
    inst = b.instance
    content = {
        name: sorted(inst.column_family(name).scan(b"", None))
        for name in inst.column_family_names()
    }
    return msgspec.msgpack.encode(content)


def complete_checkpoint(
    b: RocksDBKeyedStateBackend, store: CheckpointStorageFileStore, cid: int, slow: bool = False
) -> None:
    expected = raw_dump(b)
    snap = b.snapshot(cid)
    target = store
    if slow:
        target = StallingStore(store)  # type: ignore[assignment]
    handle = snap.write_incremental(target, f"chk-{cid}/op/0-0.state")
    store.put_bytes(expected, f"chk-{cid}/expected.msgpack")
    metadata = {"checkpoint_id": cid, "handles": [msgspec.to_builtins(handle)]}
    store.put_bytes(json.dumps(metadata).encode(), f"chk-{cid}/_metadata")
    b.notify_checkpoint_complete(cid)
    say(f"complete {cid}")


class StallingStore:
    """Uploads the first SST file, then announces itself and hangs in the second one."""

    def __init__(self, inner: CheckpointStorageFileStore) -> None:
        self.inner = inner
        self.ssts = 0

    def put_file(self, local_path: str, path: str) -> None:
        self.ssts += 1
        if self.ssts == 2:
            say("uploading")
            time.sleep(600)
        self.inner.put_file(local_path, path)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def main() -> None:
    mode, workdir, checkpoints = sys.argv[1:4]
    # the checkpoint storage the runtimes upload to
    store = CheckpointStorageFileStore(FileSystemCheckpointStorage(checkpoints, job_id=""))
    if mode == "process":
        b = backend(workdir)
        process(b, 0, 20_000, 1)
        complete_checkpoint(b, store, 1)
        process(b, 20_000, 30_000, 2)
        complete_checkpoint(b, store, 2)
        step = 3
        while True:
            process(b, 0, 5_000, step)
            say(f"processed {step}")
            step += 1
    elif mode == "upload":
        b = backend(workdir)
        process(b, 0, 20_000, 1)
        complete_checkpoint(b, store, 1)
        # many new SST files for checkpoint 2, so that the upload stalls half-way
        for step in range(2, 6):
            process(b, 0, 20_000, step)
            b.flush()
            b.instance.flush()
        complete_checkpoint(b, store, 2, slow=True)
    elif mode == "batches":
        b = backend(workdir, disable_wal=False, cache_entries=1_000_000)
        a = b.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("a", int))
        c = b.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("b", int))
        i = 0
        while True:
            for k in range(200):  # 200 records, both states each, then one flush = one batch
                b.set_current_key(k)
                a.update(i)
                c.update(i)
                i += 1
            b.flush()
            if i % 20_000 == 0:
                say(f"batches {i}")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
