"""Grading, one home for the thing RL optimises: the grader that gives the training reward, curate's gold check and
evaluation's verdict (grader.py), what it runs for each task (plan.py, from its source's harness: harness.py), the
sealed runner sent into the sandbox (sealed_*.py, one script), swebench's verdict over the grader's outcomes
(verdict.py), and swebench's own harness as the grader's referee (crosscheck.py, swebench_referee.py)."""
