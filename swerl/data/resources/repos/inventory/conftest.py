"""Marks the repository root as pytest's rootdir so `inventory` imports from the working tree."""
