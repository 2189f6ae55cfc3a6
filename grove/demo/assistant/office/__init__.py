"""What runs inside the sandbox: the office service (``server.py``) and the check of its final state
(``check.py``), both the standard library only so they run in the default image."""
