"""The public query API on the driver: ``keyed_process``, batch mode's DataFrame, a streaming
query (``KeyedStream``, ``KeyedStreamingQuery``) with its start, and how it learns of its
micro-batches in a classic session and through Spark Connect."""
