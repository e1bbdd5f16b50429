"""Helpers shared by several test modules, imported as ``support.<module>`` (``tests/`` is on
the path, as the directory of the root ``conftest.py``):

* ``checkpoint``: a function using every state kind, records for it, content dumps, SIGKILL;
* ``rocksdb``: RocksDB backend fixtures, file stores, native restores;
* ``memory_restore``: a keyed snapshot file held in memory as a restore file;
* ``window_oracle``: brute-force window oracles;
* ``s3_server``: the moto S3 server of the ``s3_*`` fixtures;
* ``state_host``: a stand-in for the Spark driver and one task, to drive a state host;
* ``hostile_peers``: connections that never complete a host handshake (silent, trickling);
* ``packet_capture``: a passive capture of an interface's TCP payloads (``AF_PACKET``, root);
* ``spark_functions``, ``spark_data``: the keyed functions of the Spark tests, their input files
  and brute-force oracles;
* ``stream_driver.py``: a streaming query as a child driver process (a script; see its
  docstring);
* ``stream_query``: ``stream_driver.py``'s query started (or restarted) in a test's own Spark
  session;
* ``killed_driver``: ``stream_driver.py`` as a child driver process SIGKILLed at a chosen point;
* ``jvm``: the JVM options of the Spark processes the tests start;
* ``cluster_results``: input, oracle and result readers of the standalone-cluster tests.
"""
