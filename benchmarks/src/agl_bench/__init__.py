"""agl-bench: the tasks of the Agent Lightning paper as agl agents, with loaders, evaluators and AIR rules.

`agl bench eval <task> --model ...` measures any model on a task; `agl bench train <task>` trains on it.
Tasks: `spider` (LangGraph SQL agent), `musique` (OpenAI Agents SDK agent with retrieval), `calc_x` (AutoGen
agent with a calculator). Nothing is imported here: each task's modules load only when that task is used.
"""
