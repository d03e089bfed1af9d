"""QuixBugs: repair a Python program with a one-line defect; the reward is the share of its tests that pass.

Modules: `data` (the 40 programs, their descriptions and the files their tests need), `runner` (runs one
program's test cases in a child process), `evaluate` (a repaired program → its tests' results, in a fresh copy,
each case under a time limit), `agent` (the `repairer`: one model call), `air` (its AIR rules), `task` (`TASK`).
"""

AGENT_NAME = "repairer"  # what the agent's LLM calls are stored and trained under
