"""CrewAI's project template writes roles like `{topic} Senior Data Researcher`: the role, and so the agent name,
changes with every `kickoff(inputs=...)`. The role before interpolation is stored as the agent's key, a second
name that training selection matches, so one entry selects the agent in every rollout; a glob on the name does
too."""

from __future__ import annotations

from typing import Any

from crewai import LLM, Agent, Crew, Process, Task
from crewai_helpers import run_one

import agl
import agl_crewai
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes

RESEARCHER = "{topic} Senior Data Researcher"
ANALYST = "{topic} Reporting Analyst"


@agl.rollout
def template_crew(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_crewai.instrument()
    model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
    researcher = Agent(role=RESEARCHER, goal="Uncover developments in {topic}", backstory="Seasoned.", llm=model)
    analyst = Agent(role=ANALYST, goal="Report on {topic}", backstory="Meticulous.", llm=model)
    research = Task(description="Research {topic}", expected_output="10 bullet points about {topic}", agent=researcher)
    report = Task(description="Review the research on {topic}", expected_output="A report", agent=analyst)
    crew = Crew(agents=[researcher, analyst], tasks=[research, report], process=Process.sequential)
    crew.kickoff(inputs={"topic": task["topic"]})
    return 1.0


def test_the_role_template_is_a_stable_key_that_selection_matches(
    agl_server: ServerProcess, agl_client: Client, instrumented: Any
) -> None:
    details = [run_one(template_crew, agl_server, agl_client, {"topic": t}) for t in ("AI LLMs", "Quantum")]
    for detail, topic in zip(details, ("AI LLMs", "Quantum"), strict=True):
        calls = sorted(detail.llm_calls, key=lambda c: c.seq)
        assert [(c.agent_name, c.agent_key) for c in calls] == [
            (f"{topic} Senior Data Researcher", RESEARCHER),
            (f"{topic} Reporting Analyst", ANALYST),
        ]

    def kept(selection: str) -> list[list[str | None]]:
        episodes, _ = build_episodes(details, AgentSelection.parse(selection))
        return [[t.agent_name for t in e.transitions] for e in episodes]

    # the key selects the researcher in both rollouts; its interpolated name only in its own
    assert kept(RESEARCHER) == [["AI LLMs Senior Data Researcher"], ["Quantum Senior Data Researcher"]]
    assert kept("*Researcher") == kept(RESEARCHER)
    assert kept("Quantum Senior Data Researcher") == [["Quantum Senior Data Researcher"]]
    assert kept(f"{RESEARCHER},{ANALYST}") == [
        ["AI LLMs Senior Data Researcher", "AI LLMs Reporting Analyst"],
        ["Quantum Senior Data Researcher", "Quantum Reporting Analyst"],
    ]


def test_an_agent_whose_role_has_no_inputs_has_no_key() -> None:
    agent = Agent(role="Writer", goal="g", backstory="b")
    assert agl_crewai.agent_key(agent) is None
    agent.interpolate_inputs({"topic": "x"})
    assert agl_crewai.agent_key(agent) is None
    templated = Agent(role="{topic}  Senior\nResearcher", goal="g", backstory="b")
    templated.interpolate_inputs({"topic": "AI"})
    assert (agl_crewai.agent_name(templated), agl_crewai.agent_key(templated)) == (
        "AI Senior Researcher",
        "{topic} Senior Researcher",
    )
