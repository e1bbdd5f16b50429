"""What crosses a process boundary between a Spark task (or the driver) and a state host: the
versioned wire protocol, the sealed channel, the handshake and the job's secret, the listener
and dial addresses.

Imported by the task, the host and the driver; imports none of them. The map of ``spark/`` by
process is in ``docs/architecture.md``.
"""
