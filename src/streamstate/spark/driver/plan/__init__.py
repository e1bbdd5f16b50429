"""What the driver plans once, when a job starts: ``keyed_process``'s arguments resolved into
the operator's options, the checks before the first Spark job, the placement of records by key
group, and the fold of a window aggregate before the shuffle."""
