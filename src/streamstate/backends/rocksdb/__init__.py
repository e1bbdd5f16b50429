"""streamstate.backends.rocksdb."""
