"""Which agent a LangChain run belongs to, read from the names LangChain and LangGraph already give it.

Selection (`AGL_TRAIN_AGENTS=writer,rewriter`) matches these names exactly, so they are taken as the framework
writes them, never rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# `langchain.agents.create_agent(..., name="writer")` puts its name on every run of the agent's graph; an agent
# nested in another one (called from a tool, or added as a node) overrides the outer name for its own runs.
AGENT_NAME_KEY = "lc_agent_name"
# LangGraph puts the name of the node on every run made while the node executes (innermost node of nested graphs).
NODE_KEY = "langgraph_node"


def agent_name_of(metadata: Mapping[str, Any] | None) -> str | None:
    """The agent a run's metadata names: a named `create_agent` first (its own nodes are all called "model" and
    "tools", which would not tell two agents apart), else the LangGraph node; None outside both."""
    if not metadata:
        return None
    for key in (AGENT_NAME_KEY, NODE_KEY):
        value = metadata.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def is_unnamed_agent(metadata: Mapping[str, Any] | None) -> bool:
    """True for a run inside a `create_agent` made without `name=`: its model node is called "model", so the calls
    of every such agent collapse into that one name."""
    if not metadata:
        return False
    return not metadata.get(AGENT_NAME_KEY) and metadata.get(NODE_KEY) == "model"


def is_node_run(metadata: Mapping[str, Any] | None, run_name: str | None) -> bool:
    """True for the run of a LangGraph node itself (its function or ToolNode), not for the runs inside it."""
    return metadata is not None and run_name is not None and metadata.get(NODE_KEY) == run_name
