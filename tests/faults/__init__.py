"""Faults injected into a real router, its sandboxes and its S3 server: nothing may be lost."""
