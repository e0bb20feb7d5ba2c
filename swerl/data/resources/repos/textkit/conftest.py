"""Marks the repository root as pytest's rootdir so `textkit` imports from the working tree."""
