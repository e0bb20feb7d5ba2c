"""Fully asynchronous rollouts for GRPO: a manager that keeps trajectories in flight and buffers finished groups
(manager), a crash-safe journal of every finished attempt in the store (journal), the staleness policy
(staleness), long-tail diagnostics (longtail) and the asynchronous training loop that ties them together (loop).
"""
