"""Stand-ins, fixtures and helpers shared by grove's tests (real servers on loopback, never patched functions)."""
