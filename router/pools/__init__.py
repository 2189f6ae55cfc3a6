"""Warm pools: their definitions and the filler that keeps them full."""
