"""The runner: claims rollouts from the server and runs the agent on them, N at a time in one process.

Each attempt holds a lease that a background loop renews with heartbeats; a runner that dies stops renewing,
the server sees the lease expire and hands the rollout to another runner. Results, spans and rewards are sent
with retries across server restarts; the server treats repeats as no-ops, so a result is recorded once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import os
import random
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from agl.capture.answer_caches import turn_off_answer_caches
from agl.capture.decorator import RolloutFunction, as_rollout_function
from agl.capture.llm import LLM
from agl.capture.sampling_warning import warn_untrainable_sampling
from agl.capture.tracing import http_inject
from agl.capture.tracing.context import RolloutContext, reset_rollout, set_rollout
from agl.capture.unnamed_calls import warn_unnamed_calls
from agl.client import AglHTTPError, AsyncClient, Conflict, NotFound, server_url_from_env
from agl.common import failure
from agl.schema import Claim, bypass_story

log = logging.getLogger(__name__)


@dataclass
class RunnerStats:
    succeeded: int = 0
    failed: int = 0
    timeout: int = 0
    superseded: int = 0  # the server gave the rollout to another attempt (lease expired); result discarded
    missed_attribution: int = 0  # LLM calls that lost their agent name (sent by a client agl does not patch)
    bypassed_llm_calls: int = 0  # LLM calls sent to another host than agl: answered, never recorded
    untrainable_sampled_calls: int = 0  # train calls stored not trainable for how the agent sampled them (greedy)
    # results the server refused with 409 (counted in `superseded` too): another report of the attempt came first
    discarded: int = 0

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.timeout + self.superseded


@dataclass
class _Active:
    claim: Claim
    ctx: RolloutContext
    task: asyncio.Task[None] | None = None
    superseded: bool = False
    # one flush at a time: the attempt's final flush waits for a heartbeat's batch still in flight, which the
    # server refuses once the attempt is reported (spans of a finished attempt): CI lost a whole batch so
    flushing: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class RunnerOptions:
    concurrency: int = 4
    lease_s: float = 30.0
    heartbeat_s: float = 5.0
    claim_wait_s: float = 2.0
    retry_for_s: float = 120.0  # how long to keep re-sending a result while the server is unreachable
    # <node>-<pid>-<random>: the dashboard counts attempts per node by the part before the pid (AGL_WORKER_NODE names
    # the node where a cluster's workers share a host name: agl.capture.ray_workers)
    worker_id: str = field(
        default_factory=lambda: (
            f"{os.environ.get('AGL_WORKER_NODE') or socket.gethostname()}-{os.getpid()}-{random.randrange(16**4):04x}"
        )
    )


class Runner:
    """Run `agent` on rollouts claimed from the server at `server_url`."""

    def __init__(
        self,
        agent: Any,
        server_url: str | None = None,
        *,
        token: str | None = None,
        model: str | None = None,
        options: RunnerOptions | None = None,
        **option_overrides: Any,
    ) -> None:
        self.agent: RolloutFunction = as_rollout_function(agent)
        self.server_url = server_url_from_env(server_url)
        self.token = token or os.environ.get("AGL_TOKEN")
        self.model = model
        self.options = options or RunnerOptions(**option_overrides)
        self.stats = RunnerStats()
        self._active: dict[str, _Active] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._stopping = False

    def stop(self) -> None:
        """Stop claiming new rollouts; the ones running finish and are reported."""
        self._stopping = True

    def run(self, *, max_rollouts: int | None = None, idle_exit_s: float | None = None) -> RunnerStats:
        return asyncio.run(self.run_async(max_rollouts=max_rollouts, idle_exit_s=idle_exit_s))

    async def run_async(self, *, max_rollouts: int | None = None, idle_exit_s: float | None = None) -> RunnerStats:
        """Claim and run rollouts until `max_rollouts` are done, or none came for `idle_exit_s`, or `stop()`."""
        http_inject.install()
        client = AsyncClient(self.server_url, token=self.token)
        self._executor = ThreadPoolExecutor(max_workers=self.options.concurrency, thread_name_prefix="agl-agent")
        heartbeats = asyncio.create_task(self._heartbeat_loop(client))
        try:
            info = await self._retry(client.info, what="reach the server")
            model = self.model or info["served_model"]
            await self._claim_loop(client, model, max_rollouts, idle_exit_s)
        finally:
            heartbeats.cancel()
            for active in list(self._active.values()):
                if active.task is not None:
                    active.task.cancel()
            await asyncio.gather(*(a.task for a in self._active.values() if a.task), return_exceptions=True)
            await client.aclose()
            self._executor.shutdown(wait=False, cancel_futures=True)
        return self.stats

    async def _claim_loop(
        self, client: AsyncClient, model: str, max_rollouts: int | None, idle_exit_s: float | None
    ) -> None:
        started = 0
        idle_since = time.monotonic()
        tasks: set[asyncio.Task[None]] = set()
        while not self._stopping:
            if max_rollouts is not None and started >= max_rollouts:
                break
            free = self.options.concurrency - len(tasks)
            if max_rollouts is not None:
                free = min(free, max_rollouts - started)
            if free <= 0:
                _, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                claims = await client.claim(
                    self.options.worker_id, free, lease_s=self.options.lease_s, wait_s=self.options.claim_wait_s
                )
            except (httpx.TransportError, AglHTTPError) as exc:
                log.warning("claim failed (%s); retrying", exc)
                claims = []
                await asyncio.sleep(1.0)
            for claim in claims:
                started += 1
                tasks.add(asyncio.create_task(self._run_attempt(client, claim, model)))
            tasks = {t for t in tasks if not t.done()}
            if claims or tasks:
                idle_since = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                break
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_attempt(self, client: AsyncClient, claim: Claim, model: str) -> None:
        key = agent_key(claim)
        ctx = RolloutContext(
            rollout_id=claim.rollout.id,
            attempt_id=claim.attempt.id,
            server_url=self.server_url,
            credential=None if key == NO_KEY else key,
        )
        active = _Active(claim, ctx, asyncio.current_task())
        self._active[ctx.attempt_id] = active
        llm = LLM(base_url=ctx.llm_base_url, model=model, api_key=key)
        status, reward, error = "succeeded", None, None
        token = set_rollout(ctx)
        turn_off_answer_caches()  # a cached answer reaches no engine: the rollout would train nothing
        try:
            call = self._call_agent(claim.task.input, llm)
            timeout = claim.rollout.timeout_s
            result = await (asyncio.wait_for(call, timeout) if timeout else call)
            reward = _as_reward(result)
        except asyncio.TimeoutError:
            status, error = "timeout", f"the agent ran past the rollout's timeout of {claim.rollout.timeout_s} s"
        except asyncio.CancelledError:
            if not active.superseded:
                raise
            status = "superseded"
        except Exception as exc:  # the agent's own failure: reported, retried by the server up to a limit
            status = "failed"
            error = failure.describe(exc)  # the message, then the traceback `agl show` prints
            log.info("rollout %s attempt %s failed: %s", ctx.rollout_id, ctx.attempt_id, failure.split(error)[0])
        finally:
            reset_rollout(token)
            self._active.pop(ctx.attempt_id, None)
        if status == "superseded":
            self.stats.superseded += 1
            return
        try:
            otel = sys.modules.get("agl.capture.tracing.otel")  # loaded only if the agent uses the OTel helper
            if otel is not None:  # its batched spans must reach the server before the attempt is reported
                await asyncio.to_thread(otel.force_flush, 10_000)
            await self._flush(client, active, final=True)
            if ctx.refused and status == "succeeded":
                status, error = "failed", "; ".join(ctx.refused)[:20_000]

            def report() -> Any:
                return client.complete(
                    ctx.attempt_id,
                    status,
                    reward=reward,
                    error=error,
                    after_llm_seq=ctx.last_llm_seq,
                    agent_scopes=ctx.agent_scopes,
                    elsewhere=ctx.elsewhere(),
                )

            try:
                completed = await self._retry(report, what=f"report attempt {ctx.attempt_id}")
            except AglHTTPError as exc:
                if exc.status != 400 or reward is None:
                    raise
                # the reward itself was refused (out of the server's range): sending it again cannot help, so the
                # attempt fails with the reason instead of running out its lease and being retried elsewhere
                log.warning("the server refused the reward of attempt %s: %s", ctx.attempt_id, exc.message)
                status, reward, error = "failed", None, f"the server refused the agent's reward: {exc.message}"
                completed = await self._retry(report, what=f"report attempt {ctx.attempt_id}")
        except Conflict as exc:
            # another report of this attempt came first (a lease that ran out and a rollout taken over, or a
            # completion that disagrees with this one): the server keeps the first, this one is lost
            log.warning(
                "result of rollout %s attempt %s (%s, reward %s) discarded by the server: %s",
                ctx.rollout_id,
                ctx.attempt_id,
                status,
                reward,
                exc.message,
            )
            self.stats.superseded += 1
            self.stats.discarded += 1
            return
        except (httpx.TransportError, AglHTTPError) as exc:
            # Unreported: the lease will expire and the server retries the rollout elsewhere.
            log.error("could not report attempt %s: %s", ctx.attempt_id, exc)
            self.stats.failed += 1
            return
        setattr(self.stats, status, getattr(self.stats, status) + 1)
        if ctx.bypassed_llm_calls:
            self.stats.bypassed_llm_calls += ctx.bypassed_llm_calls
            _warn_bypassed(ctx)
        if completed.missed_attribution:
            self.stats.missed_attribution += completed.missed_attribution
            _warn_missed_attribution(ctx, completed.missed_attribution)
        else:
            warn_unnamed_calls(ctx)
        if completed.untrainable_sampling:
            self.stats.untrainable_sampled_calls += sum(calls for _, calls, _ in completed.untrainable_sampling)
            warn_untrainable_sampling(ctx.rollout_id, completed.untrainable_sampling)

    def _call_agent(self, task_input: Any, llm: LLM) -> Any:
        if self.agent.is_async:
            return self.agent(task_input, llm)
        # A sync agent runs in a thread of its own pool with this task's context (rollout and scopes) copied in.
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        return loop.run_in_executor(self._executor, ctx.run, self.agent, task_input, llm)

    async def _flush(self, client: AsyncClient, active: _Active, *, final: bool) -> None:
        async with active.flushing:
            await self._send_recorded(client, active.ctx, final=final)

    async def _send_recorded(self, client: AsyncClient, ctx: RolloutContext, *, final: bool) -> None:
        spans, rewards = ctx.recorder.drain()
        if not spans and not rewards:
            return
        for what, items, send in (("spans", spans, client.add_spans), ("rewards", rewards, client.add_rewards)):
            if not items:
                continue
            try:
                await self._retry(lambda send=send, items=items: send(items), what=f"send {what}", patient=final)
            except AglHTTPError as exc:
                if exc.status >= 500:
                    if final:
                        raise
                    self._requeue(ctx, what, items, exc)
                    continue
                # Refused for good (bad input): sending it again cannot help. The attempt reports it as its
                # failure, so the rollout says why instead of timing out.
                log.warning("the server refused the %s of attempt %s: %s", what, ctx.attempt_id, exc.message)
                ctx.refused.append(f"the server refused the agent's {what}: {exc.message}")
            except httpx.TransportError as exc:
                if final:
                    raise
                self._requeue(ctx, what, items, exc)

    @staticmethod
    def _requeue(ctx: RolloutContext, what: str, items: Any, exc: Exception) -> None:
        log.warning("could not send %s yet (%s); will retry", what, exc)
        for item in items:
            if what == "spans":
                ctx.recorder.add_span(item)
            else:
                ctx.recorder.add_reward(item)

    async def _heartbeat_loop(self, client: AsyncClient) -> None:
        while True:
            await asyncio.sleep(self.options.heartbeat_s)
            for attempt_id, active in list(self._active.items()):
                try:
                    await client.heartbeat(attempt_id, self.options.lease_s)
                except (Conflict, NotFound) as exc:
                    if attempt_id not in self._active:
                        continue  # it finished (and reported) while this round of heartbeats was under way
                    log.warning("attempt %s was taken away (%s): cancelling it", attempt_id, exc.message)
                    active.superseded = True
                    if active.task is not None:
                        active.task.cancel()
                    continue
                except (httpx.TransportError, AglHTTPError) as exc:
                    log.warning("heartbeat for %s failed: %s", attempt_id, exc)
                    continue
                if attempt_id not in self._active or active.flushing.locked():
                    continue  # it is reporting: its final flush sends the rest (waiting here would hold up the others)
                await self._flush(client, active, final=False)

    async def _retry(self, fn: Any, *, what: str, patient: bool = True) -> Any:
        """Call `fn` until it succeeds, re-trying transport errors and 5xx for `retry_for_s` (server restarts)."""
        deadline = time.monotonic() + (self.options.retry_for_s if patient else 0)
        delay = 0.1
        while True:
            try:
                return await fn()
            except (httpx.TransportError, AglHTTPError) as exc:
                retriable = isinstance(exc, httpx.TransportError) or exc.status >= 500
                if not retriable or time.monotonic() > deadline:
                    raise
                log.warning("could not %s (%s); retrying in %.1f s", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)


_warned_bypassed = False


def _warn_bypassed(ctx: RolloutContext) -> None:
    """Once per worker process: the calls went to an LLM agl never saw (billed if it is a hosted API, and lost to
    training either way); the attempt's record keeps the count for `agl show` and the trainer."""
    global _warned_bypassed
    if _warned_bypassed:
        return
    _warned_bypassed = True
    calls, url, _, answered, refused = ctx.elsewhere()
    log.warning(
        "%d LLM call(s) of rollout %s went to %s, not to agl (%s). Point the agent's client at the run's LLM URL"
        " (%s/v1; `agl worker` sets OPENAI_BASE_URL and OPENAI_API_BASE to it unless --keep-openai-env) or at"
        " `llm.base_url`. Calls to another model on purpose: wrap them in `with agl.external_llm():` or list the"
        " host in AGL_EXTERNAL_LLM_HOSTS. (Said once per worker.)",
        calls,
        ctx.rollout_id,
        url,
        bypass_story(calls, answered, refused),
        ctx.server_url.rstrip("/"),
    )


_warned_missed = False


def _warn_missed_attribution(ctx: RolloutContext, missed: int) -> None:
    """Once per worker process: loud enough to be seen, not once per rollout of a long run."""
    global _warned_missed
    if _warned_missed:
        return
    _warned_missed = True
    stacks = ", ".join(http_inject.patched_stacks()) or "none"
    log.warning(
        "%d LLM call(s) of rollout %s reached the proxy without their agent name although the agent opened agent"
        " scopes: it sends requests with an HTTP client agl does not patch (agl patches: %s). These calls are"
        " stored as 'missed' (agl show counts them) and are not trained when agents are selected. Use a client"
        " built on a patched library, or add agl.attribution_headers() to each request. (Said once per worker.)",
        missed,
        ctx.rollout_id,
        stacks,
    )


NO_KEY = "agl"  # the API key of an agent whose server has no token (any key is accepted there)


def agent_key(claim: Claim) -> str:
    """The API key an attempt's agent (and every program it runs) gets: the attempt's LLM-only credential when the
    server has a token (agl.server.credentials), never the operator token nor the attempt credential, which also
    open the attempt's rewards and completion. A server older than the LLM credential sends only the attempt
    credential: that one, as before."""
    return claim.llm_credential or claim.credential or NO_KEY


def _as_reward(result: Any) -> float | None:
    if result is None:
        return None
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise TypeError(f"the agent returned {type(result).__name__}; return a float reward or None")
    value = float(result)
    if not math.isfinite(value):
        raise ValueError(f"the agent returned a reward of {value}; rewards must be finite")
    return value
