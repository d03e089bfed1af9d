"""`agl train` end to end on a tiny random Llama: two steps through a real `agl serve`, the proxy, worker
processes and the embedded engine; the weights change, the advantages are GRPO's formula on the recorded
rewards, the curve is drawn, and a checkpoint resumes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
from collections import defaultdict
from pathlib import Path

import pytest
from safetensors.torch import load_file

from agl.store import Store
from agl_trainer.models import build_tiny_llama
from agl_trainer.policy.trainer import PolicyConfig
from agl_trainer.run.loop import TrainConfig, TrainingRun

pytestmark = pytest.mark.slow
AGENT = str(Path(__file__).resolve().parent / "train_agents.py") + ":parity_agent"


def config(run_dir: Path, model: Path, steps: int, resume: bool = False) -> TrainConfig:
    return TrainConfig(
        agent=AGENT,
        train_tasks=[f"task {i}" for i in range(6)],
        eval_tasks=["e1", "e2", "e3"],
        run_dir=run_dir,
        model=str(model),
        device="cpu",
        steps=steps,
        tasks_per_step=2,
        group_size=4,
        eval_every=2,
        workers=1,
        concurrency=4,
        checkpoint_every=1,
        policy=PolicyConfig(lr=1e-2),
        resume=resume,
        rollout_timeout_s=120,
    )


def test_two_steps_then_resume(tmp_path: Path) -> None:
    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    summary = TrainingRun(config(run_dir, model, steps=2)).run()

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 0), ("train", 1), ("eval", 2)]
    assert summary.eval_before is not None and summary.eval_after is not None
    assert all(r["rollouts"] == 8 and r["failed"] == 0 for r in rows if r["kind"] == "train")
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the adapter moved away from its zero start (LoRA's B matrices begin at 0)
    adapter = load_file(str(run_dir / "checkpoints" / "step-2" / "adapter" / "adapter_model.safetensors"))
    assert any(float(t.abs().max()) > 0 for name, t in adapter.items() if "lora_B" in name)

    # advantages: GRPO over the 4 rollouts of each task, from the rewards the store recorded. Each rollout earns
    # 0.1 + (0 or 1), so a task's group has k rollouts that won; the advantages are known by hand for each k
    # (mean k/4, population std sqrt(k(4 − k))/4): k = 1 → winner √3, others −1/√3; k = 2 → ±1; k = 3 → winners
    # 1/√3, the other −√3; k = 0 or 4 → 0 (nothing to compare)
    root3 = math.sqrt(3)
    by_winners = {0: (0.0, 0.0), 1: (root3, -1 / root3), 2: (1.0, -1.0), 3: (1 / root3, -root3), 4: (0.0, 0.0)}
    for step in (0, 1):
        written = [
            json.loads(line) for line in (run_dir / "transitions" / f"step-{step}.jsonl").read_text().splitlines()
        ]
        with Store(run_dir) as store:
            rollouts, _ = store.list_rollouts(step=step, limit=1000)
            details = store.rollout_details([r.id for r in rollouts if r.mode == "train"])
        returns = {
            d.rollout.id: sum(r.value for r in d.rewards if r.attempt_id == d.rollout.final_attempt_id) for d in details
        }
        by_task: dict[str, list[str]] = defaultdict(list)
        for d in details:
            by_task[d.rollout.task_id].append(d.rollout.id)
        expected = {}
        for ids in by_task.values():
            assert len(ids) == 4 and all(returns[i] in (pytest.approx(0.1), pytest.approx(1.1)) for i in ids)
            won, lost = by_winners[sum(returns[i] > 1 for i in ids)]
            expected.update({i: won if returns[i] > 1 else lost for i in ids})
        assert len(written) == len(details) == 8
        for row in written:
            assert row["advantage"] == pytest.approx(expected[row["rollout_id"]], abs=1e-5)
            assert row["return"] == pytest.approx(returns[row["rollout_id"]])
            assert row["weight"] == 1.0 and row["agent"] == "speaker"

    resumed = TrainingRun(config(run_dir, model, steps=3, resume=True)).run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [
        ("eval", 0),
        ("train", 0),
        ("train", 1),
        ("eval", 2),
        ("train", 2),
        ("eval", 3),
    ]
    assert resumed.steps == 3 and (run_dir / "checkpoints" / "step-3").exists()
    with Store(run_dir) as store:
        versions = store.latest_model_version()
    assert versions is not None and versions.name == "step-3"


def test_a_run_whose_selected_agents_never_call_stops_after_its_first_step(tmp_path: Path) -> None:
    """`--agents writer` on an app whose calls are all the speaker's: a step that trains nothing stops the run,
    naming the agents the calls were under (every later step would train nothing too)."""
    import dataclasses

    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    cfg = dataclasses.replace(config(run_dir, model, steps=2), train_agents="writer")
    with pytest.raises(ValueError, match=r"step 1 trained nothing: it selects the agents writer.*speaker \(8\)"):
        TrainingRun(cfg).run()
    assert not (run_dir / "checkpoints" / "step-1").exists()


def test_per_agent_policies_train_only_the_selected_agents_adapters(tmp_path: Path) -> None:
    """`per_agent_policies` with `train_agents="speaker"`: the speaker's calls go to its own adapter and train it;
    the listener still runs, served by the base model, and gives no transitions."""
    import dataclasses

    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    cfg = dataclasses.replace(
        config(run_dir, model, steps=1),
        agent=AGENT.replace("parity_agent", "duo_agent"),
        train_agents="speaker",
        per_agent_policies=True,
    )
    TrainingRun(cfg).run()

    folder = run_dir / "checkpoints" / "step-1" / "adapter"
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["policy-speaker"]
    adapter = load_file(str(folder / "policy-speaker" / "adapter_model.safetensors"))
    assert any(float(t.abs().max()) > 0 for name, t in adapter.items() if "lora_B" in name)

    written = [json.loads(line) for line in (run_dir / "transitions" / "step-0.jsonl").read_text().splitlines()]
    assert written and {row["agent"] for row in written} == {"speaker"}
    (train_row,) = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line
    ]
    assert train_row["update_transitions/speaker"] == len(written)

    with Store(run_dir) as store:
        rollouts, _ = store.list_rollouts(step=0, limit=1000)
        details = store.rollout_details([r.id for r in rollouts if r.mode == "train"])
    served = {(c.agent_name, c.model) for d in details for c in d.llm_calls}
    assert served == {("speaker", "policy-speaker"), ("listener", "base")}


def test_per_agent_policies_need_named_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    monkeypatch.delenv("AGL_TRAIN_AGENTS", raising=False)
    cfg = dataclasses.replace(config(tmp_path / "run", tmp_path / "none", steps=1), per_agent_policies=True)
    with pytest.raises(ValueError, match="per_agent_policies needs the agents named"):
        TrainingRun(cfg)


def test_training_with_the_engine_in_another_process(tmp_path: Path) -> None:
    """`engine_url`: rollouts are generated by a separate `agl engine` process; each update's adapter is loaded
    into it, so the calls after the update are served by the new weights (stored under the new version)."""
    import dataclasses

    from agl_trainer.engines.remote import agl_engine

    model = build_tiny_llama(tmp_path / "tiny")
    with agl_engine(model) as url:
        run_dir = tmp_path / "run"
        TrainingRun(dataclasses.replace(config(run_dir, model, steps=2), engine_url=url)).run()
        loaded = sorted(p.name for p in (run_dir / "published").iterdir())
        assert loaded == ["v2", "v3"]  # the start, then one per update; the one before the previous is dropped
        with Store(run_dir) as store:
            rollouts, _ = store.list_rollouts(limit=1000)
            details = store.rollout_details([r.id for r in rollouts])
        versions = {(d.rollout.mode, d.rollout.step): {c.model_version for c in d.llm_calls} for d in details}
        models = {(d.rollout.mode, d.rollout.step): {c.model for c in d.llm_calls} for d in details}
        assert versions[("train", 0)] == {1} and versions[("train", 1)] == {2} and versions[("eval", 2)] == {3}
        # each version's adapter is served under a name of its own
        assert models[("train", 0)] == {"default@v1"} and models[("eval", 2)] == {"default@v3"}


def test_langgraph_example_trains_only_the_selected_agents_policies(tmp_path: Path) -> None:
    """The LangGraph writer → checker → rewriter graph, through the adapter, trained with one policy per selected
    agent (writer, rewriter): their adapters change; the checker runs on the base model and gives no transitions."""
    import dataclasses

    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    tasks = [{"topic": f"topic {i}", "keyword": "sea", "max_words": 5} for i in range(4)]
    cfg = dataclasses.replace(
        config(run_dir, model, steps=2),
        agent=str(Path(__file__).resolve().parent / "langgraph_train_agent.py") + ":essay",
        train_tasks=tasks,
        eval_tasks=tasks[:2],
        train_agents="writer,rewriter",
        per_agent_policies=True,
    )
    TrainingRun(cfg).run()

    folder = run_dir / "checkpoints" / "step-2" / "adapter"
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["policy-rewriter", "policy-writer"]
    for name in ("policy-rewriter", "policy-writer"):
        adapter = load_file(str(folder / name / "adapter_model.safetensors"))
        assert any(float(t.abs().max()) > 0 for key, t in adapter.items() if "lora_B" in key), name
    written = [
        json.loads(line)
        for step in (0, 1)
        for line in (run_dir / "transitions" / f"step-{step}.jsonl").read_text().splitlines()
    ]
    assert {row["agent"] for row in written} == {"writer", "rewriter"}
    with Store(run_dir) as store:
        rollouts, _ = store.list_rollouts(limit=1000)
        details = store.rollout_details([r.id for r in rollouts])
    assert all(d.rollout.status.value == "succeeded" for d in details)
    served = {(c.agent_name, c.model) for d in details for c in d.llm_calls}
    assert served == {("writer", "policy-writer"), ("checker", "base"), ("rewriter", "policy-rewriter")}


def test_a_two_step_run_logs_to_mlflow_and_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--log-to mlflow,tensorboard`: the trackers hold the rows of metrics.jsonl by step, read back with each
    library's own reader, plus one sample table per evaluation."""
    pytest.importorskip("mlflow", reason="pip install 'agl-trainer[trackers]'")
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    run_config = dataclasses.replace(config(run_dir, model, steps=2), log_to=("mlflow", "tensorboard"))
    TrainingRun(run_config).run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if r["kind"] == "train"]
    eval_steps = [r["step"] for r in rows if r["kind"] == "eval"]
    assert train_steps == [0, 1] and eval_steps == [0, 2]

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("agl").experiment_id])
    steps = {k: [m.step for m in client.get_metric_history(run.info.run_id, k)] for k in run.data.metrics}
    assert steps["train/reward_mean"] == train_steps and steps["eval/accuracy"] == eval_steps
    assert run.data.params["strategy"] == "grpo" and run.data.params["policy.lr"] == "0.01"
    samples = {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    assert samples == {"samples/eval_step_0.json", "samples/eval_step_2.json"}

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/reward_mean")] == train_steps
    assert [e.step for e in events.Scalars("eval/accuracy")] == eval_steps
    assert {f"train/{k}" for k, v in rows[1].items() if isinstance(v, float)} <= set(events.Tags()["scalars"])


def test_two_steps_with_the_verl_trainer(tmp_path: Path) -> None:
    """`--trainer verl`: the same run with the update in verl's actor worker on a local Ray; LightningRL is agl's
    (the advantages in transitions/ are the same GRPO as with agl's trainer), the embedded engine gets each
    update's weights, and the checkpoint holds a trained adapter."""
    if importlib.util.find_spec("verl") is None:
        if os.environ.get("AGL_SKIP_VERL_TESTS"):
            pytest.skip('AGL_SKIP_VERL_TESTS is set and verl is not installed (pip install "agl-trainer[verl]")')
        pytest.fail('verl is not installed: pip install "agl-trainer[verl]" (make install does)')
    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    summary = TrainingRun(dataclasses.replace(config(run_dir, model, steps=2), trainer="verl")).run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 0), ("train", 1), ("eval", 2)]
    train = [r for r in rows if r["kind"] == "train"]
    assert all(r["failed"] == 0 and r["transitions"] == 8 for r in train)
    assert all(math.isfinite(r["update_loss"]) and r["update_grad_norm"] > 0 for r in train)
    assert summary.eval_after is not None
    adapter = load_file(str(run_dir / "checkpoints" / "step-2" / "adapter" / "adapter_model.safetensors"))
    assert any(float(t.abs().max()) > 0 for name, t in adapter.items() if "lora_B" in name)
    # the calls of step 2 were generated with the weights step 1 trained: the engine got them
    with Store(run_dir) as store:
        versions = {c.model_version for r in store.list_rollouts(step=1, limit=100)[0] for c in store.llm_calls(r.id)}
    assert versions == {2}
    # the last update moved each token's log-prob the way its advantage says: recomputed by agl's own trainer on the
    # transitions of step 2 (rebuilt from the store) with the adapters before (step-1) and after (step-2) it
    moves = logprob_moves(run_dir, model, step=1)

    def token_mean(sign: int) -> float:
        chosen = [(n, d) for a, n, d in moves if a * sign > 0]
        assert chosen, f"no transition with advantage of sign {sign}: {moves}"
        return sum(n * d for n, d in chosen) / sum(n for n, _ in chosen)

    assert token_mean(+1) > 0 > token_mean(-1), moves
    assert sum(a * n * d for a, n, d in moves) > 0, moves  # what one gradient step on this batch guarantees


def test_two_steps_with_verl_and_a_policy_per_agent(tmp_path: Path) -> None:
    """`--trainer verl --per-agent-policies` on the two-agent example: one verl actor per selected agent, each
    agent's calls served by its own adapter and its transitions training that adapter alone (the unit test in
    test_verl_policy checks the alone)."""
    if importlib.util.find_spec("verl") is None:
        if os.environ.get("AGL_SKIP_VERL_TESTS"):
            pytest.skip('AGL_SKIP_VERL_TESTS is set and verl is not installed (pip install "agl-trainer[verl]")')
        pytest.fail('verl is not installed: pip install "agl-trainer[verl]" (make install does)')
    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    cfg = dataclasses.replace(
        config(run_dir, model, steps=2),
        agent=AGENT.replace("parity_agent", "duo_agent"),
        train_agents="speaker,listener",
        per_agent_policies=True,
        trainer="verl",
    )
    TrainingRun(cfg).run()
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert len(train) == 2
    for row in train:
        assert row["failed"] == 0
        assert row["update_transitions/speaker"] > 0 and row["update_transitions/listener"] > 0
        assert row["update_transitions/speaker"] + row["update_transitions/listener"] == row["transitions"]
    for agent in ("speaker", "listener"):
        folder = run_dir / "checkpoints" / "step-2" / "agents" / f"policy-{agent}" / "adapter"
        adapter = load_file(str(folder / "adapter_model.safetensors"))
        assert any(float(t.abs().max()) > 0 for name, t in adapter.items() if "lora_B" in name), agent
    with Store(run_dir) as store:
        rollouts, _ = store.list_rollouts(step=1, limit=1000)
        details = store.rollout_details([r.id for r in rollouts if r.mode == "train"])
    served = {(c.agent_name, c.model) for d in details for c in d.llm_calls}
    assert served == {("speaker", "policy-speaker"), ("listener", "policy-listener")}


def logprob_moves(run_dir: Path, model: Path, step: int) -> list[tuple[float, int, float]]:
    """(advantage, response tokens, mean change of the response's log-probs) for each transition of `step`, between
    the checkpoints before and after that step's update, computed by agl's trainer (not the backend that trained)."""
    from peft import PeftModel

    from agl.learn.transitions import build_episodes
    from agl_trainer.models import load_model
    from agl_trainer.policy.trainer import PolicyTrainer

    lines = (run_dir / "transitions" / f"step-{step}.jsonl").read_text().splitlines()
    advantages = {(r["rollout_id"], r["seq"]): r["advantage"] for r in map(json.loads, lines)}
    with Store(run_dir) as store:
        rollouts, _ = store.list_rollouts(step=step, limit=1000)
        details = store.rollout_details([r.id for r in rollouts if r.mode == "train"])
    transitions = [t for ep in build_episodes(details)[0] for t in ep.transitions]
    for t in transitions:
        t.advantage = advantages[(t.rollout_id, t.seq)]

    def mean_logprobs(checkpoint: str) -> list[float]:
        base, tokenizer = load_model(model, device="cpu")
        adapter = run_dir / "checkpoints" / checkpoint / "adapter"
        policy = PolicyTrainer(
            PeftModel.from_pretrained(base, adapter, is_trainable=True), PolicyConfig(), pad_id=tokenizer.pad_token_id
        )
        return [sum(lp) / len(lp) for lp in policy.logprobs(transitions)]

    before, after = mean_logprobs(f"step-{step}"), mean_logprobs(f"step-{step + 1}")
    return [(t.advantage, len(t.response_ids), a - b) for t, b, a in zip(transitions, before, after, strict=True)]


def test_a_step_whose_rollouts_all_sent_their_calls_around_agl_stops_the_run(tmp_path: Path, upstream: str) -> None:
    """The agent's client ignores agl's URL: every call answered by the model server directly, none recorded. The
    run stops after the first such step, saying where the calls went, instead of training on nothing."""
    model = build_tiny_llama(tmp_path / "tiny")
    agent = str(Path(__file__).resolve().parent / "e2e_agents.py") + ":elsewhere_agent"
    cfg = dataclasses.replace(
        config(tmp_path / "run", model, steps=2),
        agent=agent,
        train_tasks=[{"elsewhere": upstream, "i": i} for i in range(4)],
        eval_tasks=[{"elsewhere": upstream}],
    )
    with pytest.raises(ValueError, match="sent its LLM calls elsewhere than agl and none was recorded"):
        TrainingRun(cfg).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["eval"]  # the held-out evaluation ran; no training step was written


def test_llm_call_counts_tell_bypassing_from_silent_rollouts() -> None:
    from agl.common.trainable import TrainableRollout
    from agl.schema import Rollout, RolloutStatus, Task
    from agl_trainer.run.loop import llm_call_counts

    def rollout(bypassed: int, calls: int) -> TrainableRollout:
        r = Rollout(
            id="r", task_id="t", mode="train", step=0, status=RolloutStatus.succeeded, attempt_count=1,
            max_attempts=1, timeout_s=None, created_at=0.0, started_at=0.0, ended_at=1.0, final_attempt_id="a",
            final_reward=1.0, error=None, metadata={}, bypassed_llm_calls=bypassed,
        )  # fmt: skip
        return TrainableRollout(r, Task(id="t", input={}, metadata={}, created_at=0.0), [], [object()] * calls, [])  # type: ignore[list-item]

    counts = llm_call_counts([rollout(2, 0), rollout(1, 3), rollout(0, 0), rollout(0, 2)])
    assert counts == {"bypassed_llm_calls": 3, "rollouts_only_bypassing": 1, "rollouts_without_llm_calls": 1}


@pytest.mark.parametrize("keep_agent_sampling", [False, True])
def test_the_run_owns_the_sampling_of_a_greedy_agent(
    tmp_path: Path, keep_agent_sampling: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent that sends `temperature: 0` and a top-p (Aider, BeeAI): by default its training calls are sampled
    at the run's temperature and train; with `keep_agent_sampling` they are sent as asked, stored not trainable,
    and the step and the worker's log say why it dropped them."""
    import dataclasses

    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    cfg = dataclasses.replace(
        config(run_dir, model, steps=1),
        agent=AGENT.replace("parity_agent", "greedy_agent"),
        temperature=0.8,
        eval_tasks=["e1"],
        keep_agent_sampling=keep_agent_sampling,
    )
    TrainingRun(cfg).run()
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    with Store(run_dir) as store:
        rollouts, _ = store.list_rollouts(limit=100)
        calls = [c for d in store.rollout_details([r.id for r in rollouts if r.mode == "train"]) for c in d.llm_calls]
    assert len(calls) == 8 and all(c.request["temperature"] == 0 and c.request["top_p"] == 0.9 for c in calls)
    if keep_agent_sampling:
        assert not any(c.trainable for c in calls) and {c.temperature for c in calls} == {0.0}
        assert row["transitions"] == 0 and any("sampled greedily" in k for k in row["dropped_calls"]), row
        # the run says, once, that these rollouts train nothing and what usually causes it
        said = capsys.readouterr().out
        assert said.count("These rollouts train nothing") == 1 and "8 rollout(s) stored calls, none of them" in said
        # and each worker says, once for the agent, which of its calls its own sampling left untrained and why
        logs = [p.read_text() for p in sorted(run_dir.rglob("worker-*.log"))]
        said_by = [log.count("of agent 'speaker' in train rollout") for log in logs]
        assert said_by and max(said_by) == 1, logs  # a worker that ran only evaluations has nothing to say
        assert "sampled greedily" in "".join(logs) and "--keep-agent-sampling" in "".join(logs)
    else:
        assert all(c.trainable for c in calls) and {c.temperature for c in calls} == {0.8}
        assert row["transitions"] == 8 and "train nothing" not in capsys.readouterr().out
