"""Sandbox lifecycle: the service, starts, pool claims, scaling to zero and back, the reaper."""
