"""streamstate: Apache Flink's state layer for PySpark."""

__version__ = "0.1.0"
