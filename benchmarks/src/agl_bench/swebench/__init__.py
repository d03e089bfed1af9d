"""SWE-bench Lite and Verified: resolve a GitHub issue in its repository; the official harness (Docker) grades it.

Modules: `data` (the instances, from the hub's parquet files as `agl bench data fetch swebench` keeps them),
`agent` (`solve`: mini-swe-agent edits a clone of the repository at the instance's base commit; the patch is the
clone's `git diff`), `evaluate` (the official `swebench` harness run as a program of its own on predictions in
its format; it needs a container runtime), `task` (`TASK`).
"""

HARNESS = "mini-swe-agent"  # the coding agent that edits the repository, and the agent name its calls are stored under
