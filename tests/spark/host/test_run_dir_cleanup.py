"""Hosts that exited leave their lock, spawn lock, socket, RocksDB directory and log in the
node's run directory; a starting host removes them once stale, never a running host's."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from streamstate.spark.host.run_dir import (
    SWEEP_EVERY_S,
    SWEPT_MARK,
    clean_run_dir,
    clean_stale_host_files,
)
from streamstate.spark.wire.hosts import host_paths

NOW = 1_800_000_000.0
HOUR, DAY = 3600, 86400


def _host(directory: Path, hid: str, age: float, log_age: float | None = None) -> dict[str, str]:
    paths = host_paths(hid, str(directory))
    for kind in ("lock", "spawn", "log"):
        Path(paths[kind]).write_text("x")
    os.makedirs(os.path.join(paths["local"], "rocksdb-0"))
    for kind in ("lock", "spawn"):
        os.utime(paths[kind], (NOW - age, NOW - age))
    stamp = NOW - (age if log_age is None else log_age)
    os.utime(paths["log"], (stamp, stamp))
    return paths


def test_only_the_files_of_hosts_that_exited_long_ago_go(tmp_path: Path) -> None:
    old = _host(tmp_path, "a" * 20, age=8 * DAY)  # exited a week ago: everything goes
    recent_log = _host(tmp_path, "b" * 20, age=2 * HOUR, log_age=2 * HOUR)  # log kept
    fresh = _host(tmp_path, "c" * 20, age=60)  # just exited, or starting: kept
    running = _host(tmp_path, "d" * 20, age=8 * DAY)  # its lock is held: kept
    with open(running["lock"], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        removed = set(clean_stale_host_files(str(tmp_path), now=NOW))
    assert {old[k] for k in ("lock", "spawn", "local", "log")} <= removed
    assert not any(os.path.exists(old[k]) for k in ("lock", "spawn", "local", "log"))
    assert not os.path.exists(recent_log["lock"]) and not os.path.exists(recent_log["local"])
    assert os.path.exists(recent_log["log"])
    for kept in (fresh, running):
        assert all(os.path.exists(kept[k]) for k in ("lock", "spawn", "local", "log"))
    # nothing else in the directory is touched
    (tmp_path / "node-id").write_text("n1")
    (tmp_path / "secret").write_text("s")
    clean_stale_host_files(str(tmp_path), now=NOW + 30 * DAY)
    assert (tmp_path / "node-id").exists() and (tmp_path / "secret").exists()


def test_a_node_is_swept_at_most_once_per_interval(tmp_path: Path) -> None:
    """Every host start would read every file of the directory (a week of logs: thousands);
    the first start in an interval sweeps, the others skip it."""
    logs: list[str] = []
    first = _host(tmp_path, "a" * 20, age=8 * DAY)
    clean_run_dir(str(tmp_path), logs.append, now=NOW)
    assert not os.path.exists(first["lock"]) and len(logs) == 1
    later = _host(tmp_path, "b" * 20, age=8 * DAY)
    clean_run_dir(str(tmp_path), logs.append, now=NOW + 60)
    assert os.path.exists(later["lock"]) and len(logs) == 1  # swept a minute ago
    clean_run_dir(str(tmp_path), logs.append, now=NOW + SWEEP_EVERY_S)
    assert not os.path.exists(later["lock"]) and len(logs) == 2
    # a mark from the future (a clock set back) does not stop the sweeps
    future = _host(tmp_path, "c" * 20, age=8 * DAY)
    os.utime(tmp_path / SWEPT_MARK, (NOW + DAY, NOW + DAY))
    clean_run_dir(str(tmp_path), logs.append, now=NOW + SWEEP_EVERY_S + 1)
    assert not os.path.exists(future["lock"])
