"""The QuixBugs agent: one `repairer` call that rewrites a defective program, scored by the program's own tests.

    agl worker agl_bench.quixbugs.agent:repair --server http://127.0.0.1:8000

The model is shown the program (which carries its specification as a docstring; the description is added in
front only when the source does not already hold it) and asked for the whole corrected program in one
```python block. The program is read from its answer with `evaluate.extract_code` (the last python block that
parses, else the whole text) and run against its tests (`evaluate.evaluate`: a fresh copy, a child process, each
case under a time limit). Reward: the share of its test cases that pass. `report` stores `tests_passed_share`,
`repair_rate` (1 when every case passes) and `parses` (the answer held a program: Python that parses and
defines a function, `evaluate.parse_program`), with the failing
cases in the result's info.

Task input: `{id, program, source, description, files, cases, data_dir}` (see `data.py`) and these optional keys:
- `max_tokens` (int, default 768): the bound on the answer (the longest program is ~40 lines, ~400 tokens);
- `prompts` (`{"repairer": <system message>, "user": <template with {program}, {source}, {description}>}`):
  replace the prompts (tests put scripted-model directives here);
- `case_timeout_s`, `budget_s` (floats): the evaluator's limits (see `evaluate.py`);
- `harness` ("mini-swe-agent"): a coding harness repairs the file instead of the one call (`harness.py`).
"""

from __future__ import annotations

from typing import Any

import agl
from agl_bench.quixbugs import AGENT_NAME
from agl_bench.quixbugs.evaluate import BUDGET_S, CASE_TIMEOUT_S, evaluate, extract_code, parse_program
from agl_bench.quixbugs.harness import repair_with_harness
from agl_bench.results import report

DEFAULT_MAX_TOKENS = 768
REPAIRER_PROMPT = (
    "You repair Python programs. The program below has a bug on exactly one line. Reply with the whole corrected "
    "program in a single ```python code block, keeping the function's name and arguments."
)
USER_PROMPT = "{description}```python\n{source}\n```"
PROMPT_KEYS = (AGENT_NAME, "user")


def prompts(task: dict[str, Any]) -> dict[str, str]:
    overrides = task.get("prompts") or {}
    unknown = sorted(set(overrides) - set(PROMPT_KEYS))
    if unknown:
        raise ValueError(f"unknown prompt key(s) {', '.join(unknown)}; known: {', '.join(PROMPT_KEYS)}")
    return {AGENT_NAME: REPAIRER_PROMPT, "user": USER_PROMPT, **overrides}


def user_message(task: dict[str, Any], template: str) -> str:
    source = str(task["source"]).strip("\n")
    description = str(task.get("description") or "").strip()
    # QuixBugs programs hold their description already: shown twice it only costs a small model context
    preface = f"{description}\n\n" if description and description not in source else ""
    return template.format(program=task["program"], source=source, description=preface)


@agl.rollout
def repair(task: dict[str, Any], llm: agl.LLM) -> float:
    if task.get("harness"):  # a coding harness edits the file instead (agl_bench.quixbugs.harness)
        edited, run = repair_with_harness(task, llm)
        return score(task, edited, edited, harness_exit=run.returncode, harness_timed_out=run.timed_out)
    chosen = prompts(task)
    messages = [
        {"role": "system", "content": chosen[AGENT_NAME]},
        {"role": "user", "content": user_message(task, chosen["user"])},
    ]
    with agl.agent(AGENT_NAME):
        reply = llm.openai_client().chat.completions.create(
            model=llm.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=int(task.get("max_tokens") or DEFAULT_MAX_TOKENS),
        )
    answer = reply.choices[0].message.content or ""
    return score(task, answer, extract_code(answer))


def score(task: dict[str, Any], answer: str, code: str, **info: Any) -> float:
    """Run the program's tests on `code` and report the task's metrics; the reward is the share that pass."""
    result = evaluate(
        task,
        code,
        case_timeout_s=float(task.get("case_timeout_s") or CASE_TIMEOUT_S),
        budget_s=float(task.get("budget_s") or BUDGET_S),
        sandbox=task.get("sandbox"),  # the program the model wrote runs in agl's sandbox unless the task says "none"
    )
    share = result.reward
    summary = result.summary()
    report(
        {
            "tests_passed_share": share,
            "repair_rate": 1.0 if result.total and result.passed == result.total else 0.0,
            "parses": 1.0 if parse_program(answer) is not None else 0.0,
        },
        prediction=code,
        gold=f"the {result.total} test cases of {task['program']}",
        id=task.get("id"),
        passed=result.passed,
        total=result.total,
        timed_out=result.timed_out,
        error=result.error,
        failures=summary["failures"][:5],
        seconds=summary["seconds"],
        **info,
    )
    return share
