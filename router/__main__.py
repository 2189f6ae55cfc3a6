"""``python -m router``: start the router (the same as ``grove up``; every option of ``grove up`` works)."""

import sys

from grove.cli import main

main(["up", *sys.argv[1:]])
