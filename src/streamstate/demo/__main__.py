"""``python -m streamstate.demo [options]``: the same as ``streamstate demo [options]``."""

import sys

from streamstate.cli import app

app(["demo", *sys.argv[1:]], prog_name="streamstate")
