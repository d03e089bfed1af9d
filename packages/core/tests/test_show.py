"""`agl show`: the rollout tree puts attempts, agents, tools, LLM calls and rewards in the right places."""

from __future__ import annotations

import io

import pytest
from pydantic import JsonValue
from rich.console import Console

from agl.cli.show import render_rollout
from agl.common import attributes as attr
from agl.schema import (
    Attempt,
    AttemptStatus,
    Attribution,
    LLMCall,
    Reward,
    RewardSource,
    Rollout,
    RolloutDetail,
    RolloutStatus,
    Span,
    SpanStatus,
    Task,
)

TRACE = "0" * 31 + "1"
WRITER, CHECKER, TOOL, ORPHAN, OLD = "a" * 16, "b" * 16, "c" * 16, "d" * 16, "e" * 16


def span(
    span_id: str,
    name: str,
    start: float,
    end: float,
    attempt_id: str = "at-2",
    parent: str | None = None,
    status: SpanStatus = SpanStatus.ok,
    message: str | None = None,
    attributes: dict[str, JsonValue] | None = None,
) -> Span:
    return Span(
        trace_id=TRACE,
        span_id=span_id,
        parent_id=parent,
        name=name,
        start_time=start,
        end_time=end,
        attributes=attributes or {},
        status=status,
        status_message=message,
        rollout_id="ro-1",
        attempt_id=attempt_id,
    )


def call(
    seq: int,
    agent: str | None,
    parent: str | None,
    start: float,
    attempt_id: str = "at-2",
    trainable: bool = True,
    reason: str | None = None,
) -> LLMCall:
    return LLMCall(
        id=f"llm-{attempt_id}-{seq}",
        rollout_id="ro-1",
        attempt_id=attempt_id,
        seq=seq,
        agent_name=agent,
        attribution=Attribution.scope if agent else Attribution.unattributed,
        trace_id=TRACE,
        parent_span_id=parent,
        model_requested="gpt",
        model="policy",
        model_version=4,
        request={
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": f"ask {seq} in {attempt_id}"},
            ]
        },
        response_message={
            "role": "assistant",
            "content": f"answer {seq}",
            "tool_calls": [
                {"id": "t", "type": "function", "function": {"name": "run_sql", "arguments": '{"sql": "SELECT 1"}'}}
            ],
        },
        prompt_ids=[1, 2, 3] if trainable else None,
        response_ids=[4, 5] if trainable else None,
        logprobs=[-0.1, -0.2] if trainable else None,
        finish_reason="stop",
        stream=False,
        status="ok",
        http_status=200,
        error=None,
        started_at=start,
        latency_s=0.25,
        usage={},
        trainable=trainable,
        not_trainable_reason=reason,
    )


def reward(
    rid: int, name: str, value: float, source: RewardSource, after: int, span_id: str | None, ts: float
) -> Reward:
    return Reward(
        id=rid,
        rollout_id="ro-1",
        attempt_id="at-2",
        value=value,
        name=name,
        source=source,
        after_llm_seq=after,
        span_id=span_id,
        timestamp=ts,
    )


def make_detail() -> RolloutDetail:
    rollout = Rollout(
        id="ro-1",
        task_id="t-1",
        mode="train",
        step=3,
        status=RolloutStatus.succeeded,
        attempt_count=2,
        max_attempts=3,
        timeout_s=None,
        created_at=90.0,
        started_at=90.0,
        ended_at=105.0,
        final_attempt_id="at-2",
        final_reward=1.0,
        error=None,
        metadata={},
    )
    attempts = [
        Attempt(
            id="at-1",
            rollout_id="ro-1",
            number=1,
            worker_id="w-1",
            status=AttemptStatus.lost,
            started_at=90.0,
            heartbeat_at=91.0,
            lease_expires_at=95.0,
            ended_at=95.0,
            error="lease expired",
        ),
        Attempt(
            id="at-2",
            rollout_id="ro-1",
            number=2,
            worker_id="w-2",
            status=AttemptStatus.succeeded,
            started_at=99.0,
            heartbeat_at=104.0,
            lease_expires_at=130.0,
            ended_at=105.0,
            error=None,
        ),
    ]
    spans = [
        # Given out of order: the tree must sort by start time.
        span(CHECKER, "agent:checker", 101.0, 103.0, attributes={attr.SPAN_KIND: "agent", attr.AGENT_NAME: "checker"}),
        span(WRITER, "agent:writer", 100.0, 101.0, attributes={attr.SPAN_KIND: "agent", attr.AGENT_NAME: "writer"}),
        span(
            TOOL,
            "tool:run_sql",
            102.0,
            102.5,
            parent=CHECKER,
            status=SpanStatus.error,
            message="OperationalError",
            attributes={
                attr.SPAN_KIND: "tool",
                attr.TOOL_NAME: "run_sql",
                attr.TOOL_ARGUMENTS: '{"sql": "SELEC 1"}',
                attr.TOOL_RESULT: "[red]syntax error",
            },
        ),
        span(ORPHAN, "retrieve", 99.5, 99.7, parent="f" * 16),  # parent never arrived: hangs at attempt level
        span(OLD, "agent:writer", 91.0, 92.0, attempt_id="at-1", attributes={attr.SPAN_KIND: "agent"}),
    ]
    calls = [
        call(0, "writer", WRITER, 91.5, attempt_id="at-1"),
        call(0, "writer", WRITER, 100.2),
        call(1, "checker", CHECKER, 101.5, trainable=False, reason="backend returned no token ids"),
        call(2, None, None, 103.5),
    ]
    rewards = [
        reward(1, "tool_ok", 0.0, RewardSource.explicit, 1, CHECKER, 102.6),
        reward(2, "reward", 1.0, RewardSource.returned, 2, None, 104.0),
    ]
    task = Task(id="t-1", input={"question": "What is 2+2?\nExplain [bold]why[/bold]."}, metadata={}, created_at=89.0)
    return RolloutDetail(rollout=rollout, task=task, attempts=attempts, spans=spans, llm_calls=calls, rewards=rewards)


@pytest.fixture
def detail() -> RolloutDetail:
    return make_detail()


def render(detail: RolloutDetail, **kw: object) -> list[str]:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(render_rollout(detail, **kw))  # type: ignore[arg-type]
    return console.export_text().splitlines()


def find(lines: list[str], needle: str) -> int:
    hits = [i for i, line in enumerate(lines) if needle in line]
    assert len(hits) == 1, f"{needle!r} found on lines {hits}:\n" + "\n".join(lines)
    return hits[0]


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" │├└─"))


def test_header_and_summary(detail: RolloutDetail) -> None:
    lines = render(detail)
    text = "\n".join(lines)
    assert "rollout ro-1  succeeded" in lines[0]
    # User text is escaped, not read as markup, and folded onto one line.
    assert 'task t-1: {"question": "What is 2+2?\\nExplain [bold]why[/bold]."}' in text
    assert "reward 1 · attempts 2/3 · train step 3 · 15.0 s" in text
    summary = lines[-1]
    assert "attempt #2:" in summary
    assert "LLM calls 2/3 trainable (⚠ 1 unattributed)" in summary
    assert "tokens 6 prompt + 4 response" in summary
    assert "agents checker, writer" in summary
    assert "spans 4" in summary and "rewards 2" in summary


def test_nesting_and_order(detail: RolloutDetail) -> None:
    lines = render(detail)
    attempt2 = find(lines, "attempt #2 at-2")
    orphan = find(lines, "retrieve")
    writer = find(lines, "agent writer")
    llm0 = find(lines, "LLM #0  agent")
    checker = find(lines, "agent checker")
    llm1 = find(lines, "LLM #1  agent")
    tool = find(lines, "tool run_sql")
    tool_reward = find(lines, "reward tool_ok=0 (explicit) after LLM #1")
    llm2 = find(lines, "LLM #2  agent")
    final_reward = find(lines, "reward reward=1 (returned) after LLM #2")

    # Time order within the attempt, children right after their parent.
    assert attempt2 < orphan < writer < llm0 < checker < llm1 < tool < tool_reward < llm2 < final_reward
    assert "★ final" in lines[attempt2]
    # Top-level items of the attempt share one depth; children are deeper.
    top = indent(lines[orphan])
    assert indent(lines[attempt2]) < top
    assert indent(lines[writer]) == indent(lines[checker]) == indent(lines[llm2]) == indent(lines[final_reward]) == top
    assert indent(lines[llm0]) > top and indent(lines[llm1]) > top
    assert indent(lines[tool]) > indent(lines[checker]) and indent(lines[tool_reward]) == indent(lines[tool])


def test_llm_and_tool_lines(detail: RolloutDetail) -> None:
    lines = render(detail)
    llm0 = lines[find(lines, "LLM #0  agent")]
    # the model that served it, and the name the app asked for beside it
    assert "agent=writer  model=policy v4 (asked for gpt)  prompt 3 tok → response 2 tok  250 ms  finish=stop" in llm0
    assert "not trainable" not in llm0
    llm1 = lines[find(lines, "LLM #1  agent")]
    assert "prompt ? tok → response ? tok" in llm1
    assert "✗ not trainable: backend returned no token ids" in llm1
    assert "agent=⚠ unattributed" in lines[find(lines, "LLM #2  agent")]
    tool = lines[find(lines, "tool run_sql")]
    assert "tool run_sql error" in tool and 'args={"sql": "SELEC 1"}' in tool and "→ [red]syntax error" in tool
    assert tool.endswith("OperationalError")
    # Previews of messages only with full.
    assert not any("ask 0 in" in line for line in lines)


def test_other_attempts_collapsed_unless_full(detail: RolloutDetail) -> None:
    lines = render(detail)
    attempt1 = lines[find(lines, "attempt #1 at-1")]
    assert "worker w-1" in attempt1 and "lost" in attempt1 and "lease expired" in attempt1
    assert "(1 LLM calls, 1 spans — collapsed)" in attempt1
    assert "★ final" not in attempt1

    full = render(detail, full=True)
    assert not any("collapsed" in line for line in full)
    assert sum("LLM #0" in line for line in full) == 2  # attempt 1's call is now shown too
    assert find(full, "attempt #1 at-1") < find(full, "ask 0 in at-1") < find(full, "attempt #2 at-2")
    assert "user ▸ ask 2 in at-2" in full[find(full, "ask 2")]
    assert "assistant ◂ answer 2" in full[find(full, "answer 2")]
    assert any('tool call ◂ run_sql({"sql": "SELECT 1"})' in line for line in full)
    assert "all attempts:" in full[-1] and "LLM calls 3/4 trainable" in full[-1]


def test_pick_attempt(detail: RolloutDetail) -> None:
    lines = render(detail, attempt="1")
    assert "collapsed" in lines[find(lines, "attempt #2 at-2")]
    assert "collapsed" not in lines[find(lines, "attempt #1 at-1")]
    assert "attempt #1:" in lines[-1]
    assert render(detail, attempt="at-1") == lines
    with pytest.raises(ValueError, match="no attempt 'nope'"):
        render_rollout(detail, attempt="nope")


def test_failed_rollout_without_attempts(detail: RolloutDetail) -> None:
    detail.rollout.status = RolloutStatus.failed
    detail.rollout.final_reward = None
    detail.rollout.final_attempt_id = None
    detail.rollout.error = "all 3 attempts lost"
    detail.attempts, detail.spans, detail.llm_calls, detail.rewards = [], [], [], []
    text = "\n".join(render(detail))
    assert "failed" in text and "no reward" in text and "error: all 3 attempts lost" in text
    assert "LLM calls 0/0 trainable" in text
