"""Spider text-to-SQL: a LangGraph writer → execute → checker → rewriter agent scored by execution accuracy.

Modules: `data` (loader, splits, schema text), `evaluate` (read-only execution with a time limit, execution
accuracy, SQL extraction), `agent` (the LangGraph agent), `air` (intermediate rewards), `task` (`TASK`).
"""
