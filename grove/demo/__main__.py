"""``python -m grove.demo``: run the demo."""

from grove.demo.burst import main

main()
