"""Grading: how a task's tests are run and read (its source's harness). The grader that uses it lives in
swerl/agent/grading.py for now (issue 35 brings the sealed runner and the verdict here)."""
