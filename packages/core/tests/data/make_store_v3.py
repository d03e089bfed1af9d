"""Writes store-v3.sqlite: a run directory's store as agl-core wrote it before schema version 4 (token ids and
log-probs as JSON text). Run with that agl-core on the path, e.g.:

    git archive 980d8d9 packages/core/src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/packages/core/src python packages/core/tests/data/make_store_v3.py OUT_DIR

test_store_migration.py reads the file with today's store and compares it with the values written here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agl.schema import Attribution, EnqueueRequest, LLMCall, ModelVersionIn, RewardIn, SpanIn, TaskIn
from agl.store import Store

PROMPT = [1, 2, 3, 70000, 5]
RESPONSE = [9, 8, 7]
LOGPROBS = [-0.25, -1.5, -0.0078125]


def call(claim: object, seq: int, prompt: list[int], response: list[int], logprobs: list[float] | None) -> LLMCall:
    return LLMCall(
        id=f"llm-{seq}",
        rollout_id=claim.rollout.id,  # type: ignore[attr-defined]
        attempt_id=claim.attempt.id,  # type: ignore[attr-defined]
        seq=seq,
        agent_name="solver",
        attribution=Attribution.scope,
        trace_id=None,
        parent_span_id=None,
        model_requested="agl-policy",
        model="agl-policy",
        model_version=1,
        request={"messages": [{"role": "user", "content": "2+2?"}]},
        response_message={"role": "assistant", "content": "4"},
        prompt_ids=prompt,
        response_ids=response,
        logprobs=logprobs,
        finish_reason="stop",
        stream=False,
        status="ok",
        http_status=200,
        error=None,
        started_at=1.0,
        latency_s=0.5,
        usage={"prompt_tokens": len(prompt), "completion_tokens": len(response)},
        trainable=True,
        not_trainable_reason=None,
        temperature=0.7,
    )


def main(out: Path) -> None:
    with Store(out) as store:
        store.publish_model_version(ModelVersionIn(name="v1", upstream_model="base")).result()
        store.enqueue(EnqueueRequest(task=TaskIn(input={"q": "2+2"}), n=2)).result()
        ok, failed = store.claim("w", 2, 3600).result()
        store.add_llm_call(call(ok, 0, PROMPT, RESPONSE, LOGPROBS)).result()
        store.add_llm_call(call(ok, 1, PROMPT + RESPONSE + [11], [12], None)).result()
        store.add_spans(
            [
                SpanIn(
                    trace_id="a" * 32,
                    span_id="b" * 16,
                    name="tool calc",
                    kind="tool",
                    start_time=1.0,
                    end_time=2.0,
                    rollout_id=ok.rollout.id,
                    attempt_id=ok.attempt.id,
                    agent_name="solver",
                    source="otlp",
                )
            ]
        ).result()
        store.add_rewards(
            [RewardIn(rollout_id=ok.rollout.id, attempt_id=ok.attempt.id, value=0.25, name="tool_ok", after_llm_seq=0)]
        ).result()
        store.complete(ok.attempt.id, "succeeded", reward=1.0, after_llm_seq=1).result()
        store.complete(failed.attempt.id, "failed", error="ValueError: no answer").result()
    print(out / "agl.sqlite")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
