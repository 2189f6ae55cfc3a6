"""``python -m router``: the ``grove`` CLI."""

from router.cli import main

main()
