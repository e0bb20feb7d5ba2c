"""Marks the repository root as pytest's rootdir so `geomlib` imports from the working tree."""
