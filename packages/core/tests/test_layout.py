"""agl-core's layout by stage (`agl`'s docstring, `agl.common.layout`): no module imports a stage above its own,
and the public names and the deprecated old module paths keep working."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest

import agl
from agl.common.layout import STAGES, cycles, graph, imports, stage, upward_imports

ROOT = Path(agl.__file__).parent
DEPRECATED = {
    "agl.credit": "agl.learn.credit",
    "agl.air": "agl.learn.air",
    "agl.transitions": "agl.learn.transitions",
    "agl.trainable": "agl.common.trainable",
}


def test_no_module_imports_a_stage_above_its_own() -> None:
    modules = graph(ROOT)
    assert {"agl.capture.runner", "agl.learn.credit", "agl.store.lifecycle", "agl.server.proxy"} <= set(modules)
    upward = [line for name, targets in modules.items() for line in upward_imports(name, targets)]
    assert not upward, "\n".join(upward)


def test_no_import_circles() -> None:
    """No two modules import each other, directly or round a longer loop, even lazily or for types only."""
    assert cycles(graph(ROOT)) == []


def test_the_circle_check_is_not_vacuous() -> None:
    """A loop of three is found, a package importing its own submodule is not a loop, `agl` itself is left out."""
    modules = {
        "agl.a": {"agl.b"}, "agl.b": {"agl.c"}, "agl.c": {"agl.a", "agl"}, "agl": {"agl.a"},
        "agl.p": {"agl.p.m"}, "agl.p.m": {"agl.p"}, "agl.d": set(),
    }  # fmt: skip
    assert cycles(modules) == [["agl.a", "agl.b", "agl.c"]]
    assert cycles({**modules, "agl.d": {"agl.e"}, "agl.e": {"agl.d"}}) == [
        ["agl.a", "agl.b", "agl.c"],
        ["agl.d", "agl.e"],
    ]


def test_every_module_belongs_to_a_folder_of_its_stage() -> None:
    """Below the public face (`agl`, `agl.schema`, `agl.protocol`, `agl.client`), each module lives in its stage's
    folder: no stray top-level module."""
    top = {name for name in graph(ROOT) if name.count(".") == 1}
    public = {"agl._version", "agl.schema", "agl.protocol", "agl.client", *(p for _, _, ps in STAGES for p in ps)}
    assert top <= public, top - public


def test_the_check_catches_an_upward_import() -> None:
    """Not vacuous: a capture module importing the learning side (lazily, inside a function) or the store importing
    the server is caught; an import the other way round is not."""
    lazy = "def f():\n    from agl.learn import credit\n    return credit\n"
    assert upward_imports("agl.capture.runner", imports(lazy, "agl.capture.runner")) == [
        "agl.capture.runner (capture) imports agl.learn (learn)",
        "agl.capture.runner (capture) imports agl.learn.credit (learn)",
    ]
    assert upward_imports("agl.store.lifecycle", imports("import agl.server.app\n", "agl.store.lifecycle"))
    assert not upward_imports("agl.learn.air", imports("from agl.common import attributes\n", "agl.learn.air"))
    assert stage("agl.common.failure") == stage("agl.schema") < stage("agl.store.lifecycle") < stage("agl.server")


# `agl.__all__` before the move (0.x, issue 40): the public face the layout must not change
PUBLIC_BEFORE_THE_MOVE = {
    "AsyncClient", "Client", "LLM", "RolloutFunction", "Runner", "RunnerOptions", "Store", "__version__", "agent",
    "allow_external_llm", "attribution_headers", "configure_otel", "current_agent", "current_rollout", "emit_reward",
    "enter_agent", "exit_agent", "external_llm", "propagate", "record_span", "record_tool", "rollout", "span", "tool",
}  # fmt: skip


# what came after it: each addition named, so a name cannot leave or arrive unnoticed
ADDED_SINCE = {
    *("run_cli", "workspace", "CliResult", "record_tool_runs"),  # command-line agents as rollouts
    *("agent_home", "Sandbox", "Limits", "SandboxUnavailable", "run_sandboxed", "sandboxed", "SandboxedRun"),
    "read_agent_file",  # what a rollout runs that the model wrote, confined
}


def test_every_public_name_of_agl_still_imports() -> None:
    assert set(agl.__all__) == PUBLIC_BEFORE_THE_MOVE | ADDED_SINCE
    for name in agl.__all__:
        assert getattr(agl, name) is not None, name
    assert agl.rollout.__module__ == "agl.capture.decorator"


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED.items()))
def test_an_old_module_path_warns_and_is_the_new_module(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(old in m and new in m for m in messages), messages
