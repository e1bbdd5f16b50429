"""streamstate.windows."""
