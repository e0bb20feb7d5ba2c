"""Marks the repository root as pytest's rootdir so `calendarlib` imports from the working tree."""
