"""streamstate.backends."""
