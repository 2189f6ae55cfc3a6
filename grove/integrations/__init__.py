"""Adapters that let existing agent harnesses run on grove unchanged (each imports its harness lazily)."""
