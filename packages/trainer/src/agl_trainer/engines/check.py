"""Before training with an engine in another process: do its log-probs mean what the trainer thinks they mean?

The trainer takes the engine's log-probs as π_old and computes π_θ as log softmax(logits / T) at each call's
sampling temperature T. An engine that reports something else — vLLM's default `raw_logprobs` are temperature-1
log-probs whatever the request's temperature; another base model; other weights — makes every PPO ratio wrong
without any error. So one probe request per served policy, sampled at T = 0.5 with log-probs, is compared with
the trainer's own log-probs of the same tokens at T = 0.5 and at T = 1:

    d(T) = mean over the response tokens of |served − trainer's at T|

- d(0.5) ≤ `TOLERANCE`: the engine samples and reports the trainer's distribution. Measured on the bundled model,
  fp32 on a CPU: vLLM 0.32 with `--logprobs-mode processed_logprobs` d(0.5) = 2.6e-6 (largest token 2e-5), agl's
  engine ~1e-6; bf16 serving is ~0.01 (DESIGN.md). A temperature-1 engine is off by 0.36-0.53 per token.
- otherwise, d(1) < d(0.5): temperature-1 log-probs: refused, with the vLLM flag that fixes it.
- otherwise: refused as a different model or weights.

When the two hypotheses barely differ on the sampled tokens (mean |trainer's at 0.5 − at 1| below
`MIN_SEPARATION`: a nearly deterministic answer), another prompt is tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from agl.learn.transitions import Transition
from agl_trainer.backends import EngineError, PolicyBackend

PROBE_TEMPERATURE = 0.5
TOLERANCE = 0.05  # mean |Δ log-prob| per token
MIN_SEPARATION = 0.1
PROMPTS = (
    "Write a short story about a lighthouse keeper and a storm.",
    "Describe your ideal city in a few sentences.",
    "Invent a name for a new fruit and describe its taste.",
)


@dataclass
class ProbeResult:
    model: str
    tokens: int
    mean_abs_diff: float  # served vs the trainer's at the probe temperature
    mean_abs_diff_t1: float  # served vs the trainer's at temperature 1
    separation: float  # the trainer's at the probe temperature vs at temperature 1

    def line(self) -> str:
        return (
            f"{self.model}: served log-probs match the trainer's at T={PROBE_TEMPERATURE} to "
            f"{self.mean_abs_diff:.1e} per token ({self.tokens} tokens; at T=1 they would differ by "
            f"{self.mean_abs_diff_t1:.2f})"
        )


def _mean_abs(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / max(len(a), 1)


@dataclass
class Answer:
    """A server's answer to a probe: the token ids it sampled and the log-prob it reported for each."""

    prompt_ids: list[int]
    response_ids: list[int]
    served: list[float]


def ask(http: httpx.Client, base_url: str, model: str, prompt: str, seed: int) -> Answer:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": PROBE_TEMPERATURE,
        "max_tokens": 32,
        "seed": seed,
        "logprobs": True,
        "return_token_ids": True,
    }
    try:
        resp = http.post(f"{base_url.rstrip('/')}/chat/completions", json=body)
    except httpx.HTTPError as exc:
        raise EngineError(f"the log-prob probe could not reach {base_url}: {exc}") from exc
    if resp.status_code != 200:
        raise EngineError(
            f"the log-prob probe to {base_url} ({model!r}) failed: HTTP {resp.status_code} {resp.text[:500]}"
        )
    answer = resp.json()
    choice = answer["choices"][0]
    prompt_ids = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
    response_ids = choice.get("token_ids")
    served = [float(c["logprob"]) for c in ((choice.get("logprobs") or {}).get("content") or [])]
    if not prompt_ids or not response_ids or len(served) != len(response_ids):
        raise EngineError(
            f"{base_url} answered the probe without token ids and one log-prob per token: agl needs an engine that "
            "honours `return_token_ids` and `logprobs` (vLLM ≥ 0.10, or `agl engine`)"
        )
    return Answer(list(prompt_ids), list(response_ids), served)


def compare(policy: PolicyBackend, model: str, agent: str | None, answers: Sequence[Answer]) -> list[ProbeResult]:
    """Each answer's log-probs against the trainer's at the probe temperature and at 1, all in one call of the
    policy: on colocated GPUs each call is a turn of the trainer, every server asleep meanwhile, so one turn for
    every server's answer (a turn per server handed each GPU over once per server at each publication)."""
    temperatures = (PROBE_TEMPERATURE, 1.0)
    batch = [
        Transition(
            rollout_id="probe",
            task_id="probe",
            attempt_id="probe",
            seq=0,
            agent_name=agent,
            prompt_ids=a.prompt_ids,
            response_ids=a.response_ids,
            response_mask=[1] * len(a.response_ids),
            logprobs=None,
            model_version=None,
            call_ids=[],
            temperature=t,
        )
        for a in answers
        for t in temperatures
    ]
    mine = list(policy.logprobs(batch))
    results = []
    for i, a in enumerate(answers):
        at_probe, at_one = mine[2 * i], mine[2 * i + 1]
        results.append(
            ProbeResult(
                model=model,
                tokens=len(a.response_ids),
                mean_abs_diff=_mean_abs(a.served, at_probe),
                mean_abs_diff_t1=_mean_abs(a.served, at_one),
                separation=_mean_abs(at_probe, at_one),
            )
        )
    return results


def check_servers(
    base_urls: Sequence[str],
    policy: PolicyBackend,
    served: Sequence[tuple[str, str | None]],
    timeout_s: float = 300.0,
    transport: httpx.BaseTransport | None = None,
    headers: dict[str, str] | None = None,
) -> list[tuple[str, ProbeResult]]:
    """Probe each `(served model name, an agent it serves)` on every server of `base_urls` (the same prompt to
    each, the trainer's side computed once for all); raise `EngineError` naming the first server whose log-probs
    are not the trainer's at the sampling temperature. (server, result) for each server and model."""
    out: list[tuple[str, ProbeResult]] = []
    with httpx.Client(timeout=timeout_s, transport=transport, headers=headers) as http:
        for model, agent in served:
            results: list[ProbeResult] = []
            for seed, prompt in enumerate(PROMPTS):
                answers = [ask(http, url, model, prompt, seed) for url in base_urls]
                results = compare(policy, model, agent, answers)
                if all(r.separation >= MIN_SEPARATION for r in results):
                    break
            for url, result in zip(base_urls, results, strict=True):
                judge(url, model, result)
                out.append((url, result))
    return out


def check_served_logprobs(
    base_url: str,
    policy: PolicyBackend,
    served: Sequence[tuple[str, str | None]],
    timeout_s: float = 300.0,
    transport: httpx.BaseTransport | None = None,
    headers: dict[str, str] | None = None,
) -> list[ProbeResult]:
    """`check_servers` on one server: its result for each served model."""
    return [r for _, r in check_servers([base_url], policy, served, timeout_s, transport, headers)]


def judge(base_url: str, model: str, result: ProbeResult) -> None:
    """Raise `EngineError` if `result` shows log-probs that are not the trainer's at the sampling temperature."""
    if result.mean_abs_diff <= TOLERANCE:
        return
    if result.mean_abs_diff_t1 < result.mean_abs_diff:
        raise EngineError(
            f"{base_url} ({model!r}) reports temperature-1 log-probs for a response sampled at "
            f"T={PROBE_TEMPERATURE} (they differ from the trainer's at T={PROBE_TEMPERATURE} by "
            f"{result.mean_abs_diff:.3f} per token, from its T=1 ones by {result.mean_abs_diff_t1:.3f}): "
            "start vLLM with `--logprobs-mode processed_logprobs` (agl train --engine vllm does so)"
        )
    raise EngineError(
        f"{base_url} ({model!r}) serves log-probs that differ from the trainer's by "
        f"{result.mean_abs_diff:.3f} per token on average (tolerance {TOLERANCE}): it must serve the same "
        "base model, in a comparable dtype, with the adapters agl publishes"
    )
