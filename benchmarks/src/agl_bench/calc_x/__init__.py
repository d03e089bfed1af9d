"""Calc-X: math word problems solved by an AutoGen `solver` agent with a safe calculator tool.

Modules: `data` (loader: JSONL or parquet), `calculator` (exact, bounded expression evaluator; the tool),
`evaluate` (answer extraction and Agent Lightning's Calc-X equivalence rule), `agent` (the AutoGen agent),
`air` (intermediate rewards), `task` (`TASK`).
"""

AGENT_NAME = "solver"  # the AssistantAgent's name: what its LLM calls are stored and trained under
TOOL_NAME = "calculator"
