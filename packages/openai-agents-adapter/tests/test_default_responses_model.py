"""The SDK's default model (the Responses API) and default client, unchanged, through a real `agl worker`: every
call reaches agl's proxy at the fixed URL, lands in its rollout under the agent that made it (through a handoff),
and is recorded with exact token ids, ready for training."""

from __future__ import annotations

from pathlib import Path

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, render_prompt

APP = Path(__file__).with_name("default_model_app.py")
INSTRUCTIONS = {
    "triage": "You are triage.\nagl-tools: transfer_to_math",
    "math": "You are math.\nagl-tools: calculator",
}


def test_the_default_responses_model_trains_unchanged(
    agl_server: ServerProcess, agl_client: Client, agl_workers: object
) -> None:
    tasks = [
        {"question": f"What is {a} * {b}?", "answer": a * b, "instructions": INSTRUCTIONS} for a, b in [(3, 4), (6, 7)]
    ]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    env = {"OPENAI_BASE_URL": f"{agl_server.url}/v1", "OPENAI_API_KEY": "sk-not-used"}
    agl_workers(f"{APP}:solve", agl_server.url, env=env)  # type: ignore[operator]
    rollouts = wait_rollouts(agl_client, ids, timeout=120)
    assert [r.status.value for r in rollouts] == ["succeeded"] * 2, [r.error for r in rollouts]
    for detail in agl_client.rollout_details(ids):
        calls = sorted(detail.llm_calls, key=lambda c: c.seq)
        assert [c.agent_name for c in calls] == ["triage", "math", "math"]
        for call in calls:
            assert call.trainable and call.response_ids and call.logprobs
            assert call.prompt_ids == encode(render_prompt(call.request["messages"], call.request.get("tools")))
        # the math agent's second call saw its calculator's output as a tool message
        assert calls[2].request["messages"][-1]["role"] == "tool"
        assert detail.rollout.final_reward == 1.0
