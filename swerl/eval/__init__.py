"""Evaluation: pass@k with confidence intervals over held-out tasks."""
