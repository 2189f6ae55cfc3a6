"""Attacks on a real router and real sandboxes, one per security promise (see SECURITY.md)."""
