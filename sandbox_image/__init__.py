"""The grove runtime bundle: a self-contained Python + executor injected into any task image."""
