"""streamstate.spark."""
