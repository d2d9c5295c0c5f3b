"""Soak testing of the server (docs/soak.md)."""
