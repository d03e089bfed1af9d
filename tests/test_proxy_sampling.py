"""What the proxy tells the backend about sampling, and what it stores for the trainer.

The trainer computes each transition's log-probs at the temperature its response was sampled with, and needs
the backend's behaviour log-probs for every trained call. So the proxy always sends a temperature (the agent's,
else `agl serve --temperature`; `--eval-temperature` in evaluations) and stores it; always asks for log-probs
(taking them back out of the answer of an agent that said `"logprobs": false`); and stores as not trainable a
training call sampled from a distribution the trainer does not optimise (greedy, top-p, penalties).
A real `agl serve` and the scripted upstream, which echoes the temperature it was sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agl.client import Client
from agl.common.processes import ServerProcess, start_server
from agl.schema import LLMCall

SAY_TEMPERATURE = {"role": "system", "content": "agl-say: sampled at {temperature}"}


@pytest.fixture
def sampling_server(tmp_path: Path, upstream: str) -> Iterator[ServerProcess]:
    server = start_server(tmp_path / "run", upstream=upstream, extra_args=["--temperature=0.6", "--eval-temperature=0"])
    yield server
    server.stop()


def attempt_url(server: ServerProcess, client: Client, mode: str) -> tuple[str, str]:
    (rollout,) = client.enqueue("x", mode=mode)
    (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w"}).json()
    return rollout.id, f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}/v1"


def stored(client: Client, rollout_id: str) -> list[LLMCall]:
    return sorted(client.rollout_detail(rollout_id).llm_calls, key=lambda c: c.seq)


def chat(base_url: str, **kw: Any) -> Any:
    llm = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
    return llm.chat.completions.create(model="m", messages=[SAY_TEMPERATURE, {"role": "user", "content": "hi"}], **kw)


def test_every_call_is_sent_and_stored_with_the_temperature_it_was_sampled_at(sampling_server: ServerProcess) -> None:
    with Client(sampling_server.url) as client:
        rollout_id, base = attempt_url(sampling_server, client, "train")
        default = chat(base)
        own = chat(base, temperature=0.9)
        eval_id, eval_base = attempt_url(sampling_server, client, "eval")
        evaluated = chat(eval_base, temperature=0.9)
        calls = stored(client, rollout_id) + stored(client, eval_id)
    # what the backend received, echoed back, and what the store keeps for the trainer agree
    assert [default.choices[0].message.content, own.choices[0].message.content] == [
        "sampled at 0.6",
        "sampled at 0.9",
    ]
    assert evaluated.choices[0].message.content == "sampled at 0.0"
    assert [c.temperature for c in calls] == [0.6, 0.9, 0.0]
    assert [c.trainable for c in calls[:2]] == [True, True]


@pytest.mark.parametrize(
    ("sampling", "reason"),
    [
        ({"temperature": 0}, "sampled greedily"),
        ({"top_p": 0.9}, "top_p=0.9"),
        ({"presence_penalty": 0.5}, "presence_penalty=0.5"),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
    ],
)
def test_training_calls_sampled_from_another_distribution_are_stored_not_trainable(
    sampling_server: ServerProcess, sampling: dict[str, Any], reason: str
) -> None:
    with Client(sampling_server.url) as client:
        rollout_id, base = attempt_url(sampling_server, client, "train")
        chat(base, **sampling)
        neutral = chat(base, top_p=1.0, presence_penalty=0)  # the neutral values change nothing
        (call, plain) = stored(client, rollout_id)
    assert not call.trainable and reason in (call.not_trainable_reason or "")
    assert neutral.choices[0].message.content and plain.trainable


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_false_still_stores_the_log_probs_and_the_agent_gets_none(
    sampling_server: ServerProcess, stream: bool
) -> None:
    with Client(sampling_server.url) as client:
        rollout_id, base = attempt_url(sampling_server, client, "train")
        if stream:
            chunks = list(chat(base, logprobs=False, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "sampled at 0.6"
            assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
        else:
            answer = chat(base, logprobs=False)
            assert answer.choices[0].message.content == "sampled at 0.6" and answer.choices[0].logprobs is None
        asked = chat(base, logprobs=True)  # an agent that asks keeps getting them
        (call, other) = stored(client, rollout_id)
    assert call.trainable and call.logprobs is not None and len(call.logprobs) == len(call.response_ids or [])
    assert asked.choices[0].logprobs is not None and other.logprobs is not None


def test_the_run_samples_the_training_calls_of_the_agents_it_owns(tmp_path: Path, upstream: str) -> None:
    """`--own-sampling-for` (agl train sets it): a trained agent's greedy, truncated call (Aider and BeeAI send
    `temperature: 0`) goes to the engine at the run's temperature without its top-p, is stored trainable with what
    the agent asked kept in its request, and the server says once per agent that it overrode it. Another agent's
    calls, and evaluation calls, are sent as before."""
    from agl.common.attributes import HEADER_AGENT

    server = start_server(
        tmp_path / "run",
        upstream=upstream,
        extra_args=["--temperature=0.6", "--eval-temperature=0", "--own-sampling-for=coder,*Planner"],
    )
    say = {"role": "system", "content": "agl-say: sampled at {temperature} top_p {top_p}"}
    try:
        with Client(server.url) as client:
            rollout_id, base = attempt_url(server, client, "train")
            llm = openai.OpenAI(base_url=base, api_key="k", max_retries=0)

            def ask(agent: str | None, **kw: Any) -> str:
                headers = {HEADER_AGENT: agent} if agent else {}
                answer = llm.chat.completions.create(
                    model="m", messages=[say, {"role": "user", "content": "hi"}], extra_headers=headers, **kw
                )
                return str(answer.choices[0].message.content)

            owned = [ask("coder", temperature=0, top_p=0.5), ask("Senior Planner", temperature=0), ask("coder")]
            other = ask("judge", temperature=0)
            unnamed = ask(None, temperature=0, top_p=0.5)
            _, eval_base = attempt_url(server, client, "eval")
            evaluated = openai.OpenAI(base_url=eval_base, api_key="k", max_retries=0).chat.completions.create(
                model="m", messages=[say], extra_headers={HEADER_AGENT: "coder"}, temperature=0.9
            )
            calls = stored(client, rollout_id)
    finally:
        server.stop()
    assert owned == ["sampled at 0.6 top_p None"] * 3
    assert [other, unnamed] == ["sampled at 0 top_p None", "sampled at 0 top_p 0.5"]
    assert evaluated.choices[0].message.content == "sampled at 0.0 top_p None"
    assert [c.trainable for c in calls] == [True, True, True, False, False]
    assert [c.temperature for c in calls] == [0.6, 0.6, 0.6, 0.0, 0.0]
    assert calls[0].request["temperature"] == 0 and calls[0].request["top_p"] == 0.5  # what the agent asked
    assert "sampled greedily" in (calls[3].not_trainable_reason or "")
    log = server.log_path.read_text()
    assert log.count("agent 'coder' asked for") == 1 and "temperature=0, top_p=0.5" in log
    assert log.count("agent 'Senior Planner' asked for temperature=0;") == 1
    assert "'judge'" not in log


def test_a_bad_own_sampling_selection_is_refused_by_its_option(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "serve", f"--run-dir={tmp_path}", "--own-sampling-for=a,*,b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--own-sampling-for" in done.stderr and "'*'" in done.stderr
