"""The offline tools of the driver: what reads or rewrites checkpoints outside a running query."""
