"""Marks the repository root as pytest's rootdir so `gridpath` imports from the working tree."""
