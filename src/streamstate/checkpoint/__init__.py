"""streamstate.checkpoint."""
