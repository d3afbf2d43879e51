"""Helpers shared by the hook's integration tests."""
