"""What the driver measures of a streaming query: one recorder of named spans, the figures made
of them and of the subtasks' acknowledgements (``query.batches``), and their way into Spark's
own progress."""
