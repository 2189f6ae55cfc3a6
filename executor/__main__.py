"""``python -m executor``: serve the executor under gunicorn."""

from executor.serve import main

main()
