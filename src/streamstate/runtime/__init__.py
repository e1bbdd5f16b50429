"""streamstate.runtime."""
