"""What runs per micro-batch on the driver (or a Spark Connect server's Python process): Spark's
``foreachBatch`` function, the plan and commit of each step in the checkpoint log, the
subtasks' Spark job (or the driver's own delivery), the outputs handed to the sinks (the staged
outputs a checkpoint records, checked), no-data micro-batches and the idle ticker, and the
run's state hosts."""
