"""The assistant demo (``python -m grove.demo --assistant``): offline personal-assistant tasks on a small mail,
calendar and notes service, each graded by the service's final state."""
