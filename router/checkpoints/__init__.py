"""Checkpoints of sandboxes, and sandboxes made from them (restores and forks), with their lineage."""
