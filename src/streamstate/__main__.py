"""``python -m streamstate``: the ``streamstate`` command line."""

from streamstate.cli import main

main()
