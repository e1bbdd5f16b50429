"""streamstate.api."""
