# The e2b template swerl's e2b backend starts sandboxes from (swerl/sandbox/e2b.py).
# Build and register it with the e2b CLI from this directory:  e2b template build  (reads e2b.toml)
# A per-repository template (the repository and its dependencies preinstalled under /workspace) can extend this
# one; the backend still uploads the task's repository state, so a plain base template works for any task.
FROM debian:bookworm-slim

# What a task's commands and grading need: Python with venv and pip, git (the agent's patch is a git diff),
# coreutils `timeout` (how a command's timeout kills its process group inside the VM), and pytest.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip python-is-python3 git ca-certificates coreutils procps \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m pip install --no-cache-dir --break-system-packages pytest==8.3.5

# e2b runs commands as `user`; the workspace is theirs, nothing else on the file system is writable to them.
RUN useradd --create-home --uid 1000 --shell /bin/bash user 2>/dev/null || true \
 && mkdir -p /workspace && chown user:user /workspace

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8
WORKDIR /workspace
