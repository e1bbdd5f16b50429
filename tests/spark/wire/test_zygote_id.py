"""Which spawners share a host zygote (streamstate.spark.wire.hosts.zygote_id)."""

from __future__ import annotations

from streamstate.spark.wire.hosts import zygote_id


def test_spawners_share_a_zygote_only_where_their_hosts_would_start_alike() -> None:
    env = {"PYTHONPATH": "/src", "STREAMSTATE_RUN_DIR": "/run", "HOME": "/root"}
    base = zygote_id(env, 42, 7)
    assert base.startswith("z") and len(base) == 20  # a host id's length: the same socket limit
    # read when an interpreter starts or a module is imported: a zygote of their own
    for name, value in [
        ("PYTHONPATH", "/other"),
        ("PYTHONHASHSEED", "0"),
        ("STREAMSTATE_PURE_PYTHON", "1"),
        ("LD_PRELOAD", "/lib/x.so"),
        ("OMP_NUM_THREADS", "1"),
    ]:
        assert zygote_id({**env, name: value}, 42, 7) != base, name
    # another JVM, or the same pid reused
    assert zygote_id(env, 43, 7) != base and zygote_id(env, 42, 8) != base
    # what the host only reads later reaches it with the request: the same zygote
    assert zygote_id({**env, "AWS_ACCESS_KEY_ID": "x", "HOME": "/home/u"}, 42, 7) == base
