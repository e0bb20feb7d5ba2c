"""Marks the repository root as pytest's rootdir so `money` imports from the working tree."""
