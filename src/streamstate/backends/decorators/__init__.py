"""streamstate.backends.decorators."""
