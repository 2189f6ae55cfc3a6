"""``make demo``: a small but real evaluation burst on the embedded defaults (``python -m grove.demo``)."""
