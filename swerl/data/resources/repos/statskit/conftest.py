"""Marks the repository root as pytest's rootdir so `statskit` imports from the working tree."""
