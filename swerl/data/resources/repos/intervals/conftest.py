"""Marks the repository root as pytest's rootdir so `intervals` imports from the working tree."""
