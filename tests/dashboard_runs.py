"""Run directories for the dashboard tests, written through the real store: rollouts of known statuses, modes,
steps, agents and rewards; a failed attempt with a traceback; a tool span in error and an AIR reward; and the
trainer's files (metrics.jsonl, transitions/step-N.jsonl) as the trainer writes them."""

from __future__ import annotations

import json
from pathlib import Path

from agl.common import failure
from agl.schema import Attribution, EnqueueRequest, LLMCall, RewardIn, RewardSource, SpanIn, SpanStatus, TaskIn
from agl.store import Store


def call(claim: object, seq: int, agent: str, text: str) -> LLMCall:
    return LLMCall(
        id=f"llm-{claim.attempt.id}-{seq}",  # type: ignore[attr-defined]
        rollout_id=claim.rollout.id,  # type: ignore[attr-defined]
        attempt_id=claim.attempt.id,  # type: ignore[attr-defined]
        seq=seq,
        agent_name=agent,
        attribution=Attribution.scope,
        trace_id=None,
        parent_span_id=None,
        model_requested="agl-policy",
        model="agl-policy",
        model_version=1,
        request={"messages": [{"role": "user", "content": f"question for {agent}"}]},
        response_message={"role": "assistant", "content": text},
        prompt_ids=[1, 2, 3, 4],
        response_ids=[5, 6],
        logprobs=[-0.5, -0.25],
        finish_reason="stop",
        stream=False,
        status="ok",
        http_status=200,
        error=None,
        started_at=1000.0 + seq,
        latency_s=0.05,
        usage={},
        trainable=True,
        not_trainable_reason=None,
        temperature=0.7,
    )


def _boom() -> str:
    try:
        raise ValueError("the agent could not parse the answer")
    except ValueError as exc:
        return failure.describe(exc)


def write_run(run_dir: Path, *, steps: int = 2, per_step: int = 4, extra_queued: int = 0) -> dict[str, list[str]]:
    """A finished two-step run (plus an evaluation and a failed rollout); ids by what they are."""
    ids: dict[str, list[str]] = {"succeeded": [], "failed": [], "eval": [], "queued": [], "writer": []}
    transitions: dict[int, list[dict[str, object]]] = {}
    with Store(run_dir) as store:
        for step in range(steps):
            store.enqueue(EnqueueRequest(task=TaskIn(input={"q": step}), n=per_step, mode="train", step=step)).result()
            for i, claim in enumerate(store.claim("w1", per_step, 60).result()):
                agent = "writer" if i % 2 == 0 else "checker"
                store.add_llm_call(call(claim, 0, agent, f"answer {step}.{i}")).result()
                store.add_spans(
                    [
                        SpanIn(
                            trace_id=f"{step:016x}{i:016x}",
                            span_id=f"{i + 1:016x}",
                            name="tool:calculator",
                            kind="tool",
                            start_time=1000.5,
                            end_time=1000.6,
                            attributes={"agl.span.kind": "tool", "gen_ai.tool.name": "calculator"},
                            status=SpanStatus.error if i == 1 else SpanStatus.ok,
                            status_message="ZeroDivisionError: division by zero" if i == 1 else None,
                            rollout_id=claim.rollout.id,
                            attempt_id=claim.attempt.id,
                            agent_name=agent,
                            source="agl",
                        )
                    ]
                ).result()
                if i == 1:
                    store.add_rewards(
                        [
                            RewardIn(
                                rollout_id=claim.rollout.id,
                                attempt_id=claim.attempt.id,
                                value=-0.1,
                                name="air:tool_status",
                                source=RewardSource.automatic,
                                after_llm_seq=0,
                            )
                        ]
                    ).result()
                reward = float(i % 2 == 0)
                store.complete(claim.attempt.id, "succeeded", reward=reward, after_llm_seq=0).result()
                ids["succeeded"].append(claim.rollout.id)
                if agent == "writer":
                    ids["writer"].append(claim.rollout.id)
                transitions.setdefault(step, []).append(
                    {
                        "rollout_id": claim.rollout.id,
                        "task_id": claim.rollout.task_id,
                        "seq": 0,
                        "agent": agent,
                        "reward": reward,
                        "return": reward,
                        "advantage": reward - 0.5,
                        "weight": 1.0,
                        "prompt_tokens": 4,
                        "response_tokens": 2,
                    }
                )
        # an evaluation rollout, and a rollout whose only attempt failed with a traceback
        store.enqueue(EnqueueRequest(task=TaskIn(input={"q": "eval"}), n=1, mode="eval", step=steps)).result()
        (claim,) = store.claim("w1", 1, 60).result()
        store.complete(claim.attempt.id, "succeeded", reward=1.0).result()
        ids["eval"].append(claim.rollout.id)
        store.enqueue(
            EnqueueRequest(task=TaskIn(input={"q": "fails"}), n=1, mode="train", step=steps, max_attempts=1)
        ).result()
        (claim,) = store.claim("w1", 1, 60).result()
        store.complete(claim.attempt.id, "failed", error=_boom()).result()
        ids["failed"].append(claim.rollout.id)
        if extra_queued:
            made = store.enqueue(EnqueueRequest(task=TaskIn(input={"q": "later"}), n=extra_queued)).result()
            ids["queued"] = [r.id for r in made]
    (run_dir / "transitions").mkdir(exist_ok=True)
    for step, rows in transitions.items():
        (run_dir / "transitions" / f"step-{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = [{"kind": "eval", "step": 0, "accuracy": 0.25}]
    metrics += [{"kind": "train", "step": s, "reward_mean": 0.5 + 0.1 * s, "success_rate": 0.5} for s in range(steps)]
    # the last step overlapped its update (max_staleness 1) with the off-policy correction on
    metrics[-1].update(
        transitions=4,
        staleness={"0": 3, "1": 1},
        update_is_weight_mean=0.9981,
        update_is_weight_max=1.3125,
        engine_busy=0.91,
        trainer_busy=0.62,
        tokens_per_s=118.4,
        step_s=4.52,
    )
    metrics += [{"kind": "eval", "step": steps, "accuracy": 0.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return ids
