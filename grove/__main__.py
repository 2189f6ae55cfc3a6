"""``python -m grove``: the ``grove`` command."""

from grove.cli import main

main()
