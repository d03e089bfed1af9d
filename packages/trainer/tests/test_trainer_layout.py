"""agl-trainer's layout by its parts (`agl_trainer`'s docstring, `agl_trainer.stages`): no module imports a stage
above its own, no import circles, every module in its stage's folder, and the paths user code imports keep working.
Read from the source alone: nothing heavy is imported."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import agl_trainer
from agl.common.layout import imports
from agl_trainer.stages import DEPRECATED, STAGES, cycles, graph, stage, upward_imports


def test_no_module_imports_a_stage_above_its_own() -> None:
    modules = graph()
    assert {"agl_trainer.run.loop", "agl_trainer.engines.embedded", "agl_trainer.policy.trainer"} <= set(modules)
    assert {"agl_trainer.verl.backend", "agl_trainer.plan.build", "agl_trainer.tracking.trackers"} <= set(modules)
    upward = [line for name, targets in modules.items() for line in upward_imports(name, targets)]
    assert not upward, "\n".join(upward)


def test_no_import_circles() -> None:
    """No two modules import each other, directly or round a longer loop, even lazily or for types only."""
    assert cycles(graph()) == []


def test_every_module_belongs_to_a_folder_of_its_stage() -> None:
    """Below the package itself, each module lives in its stage's folder or is one the map names at the top: no
    stray top-level module."""
    top = {name for name in graph() if name.count(".") == 1}
    named = {prefix for _, _, prefixes in STAGES for prefix in prefixes}
    assert top <= named, top - named
    for name in graph():
        stage(name)  # raises for a module no stage holds


def test_the_check_catches_an_upward_import_and_a_circle() -> None:
    """Not vacuous: the policy importing an engine (lazily, inside a function), an engine importing the run or the
    base importing the plan is caught; an import the other way round is not; a circle is found."""
    lazy = "def f():\n    from agl_trainer.engines import embedded\n    return embedded\n"
    assert upward_imports("agl_trainer.policy.trainer", imports(lazy, "agl_trainer.policy.trainer")) == [
        "agl_trainer.policy.trainer (policy) imports agl_trainer.engines (engines)",
        "agl_trainer.policy.trainer (policy) imports agl_trainer.engines.embedded (engines)",
    ]
    engine = imports("import agl_trainer.run.loop\n", "agl_trainer.engines.remote")
    assert upward_imports("agl_trainer.engines.remote", engine)
    base = imports("from agl_trainer.plan.hardware import Hardware\n", "agl_trainer.backends")
    assert upward_imports("agl_trainer.backends", base)
    run = imports("from agl_trainer.engines.colocation import Colocation\n", "agl_trainer.run.loop")
    assert not upward_imports("agl_trainer.run.loop", run)
    assert imports("from agl.learn import credit\n", "agl_trainer.run.loop") == set()  # agl-core is below the trainer
    assert stage("agl_trainer.config") < stage("agl_trainer.policy.packing") < stage("agl_trainer.engines.fleet")
    assert stage("agl_trainer.engines.fleet") < stage("agl_trainer.plan.build") < stage("agl_trainer.run.setup")
    circle = {**graph(), "agl_trainer.backends": {"agl_trainer.engines.fan_out"}}  # the circle there once was
    assert cycles(circle) == [["agl_trainer.backends", "agl_trainer.engines.fan_out"]]


def test_the_public_face_and_the_cli_entry_points() -> None:
    """`import agl_trainer` stays light, and `agl train` / `agl engine` are where the entry points say."""
    assert agl_trainer.__version__
    from importlib.metadata import entry_points

    commands = {ep.name: ep.value for ep in entry_points(group="agl.commands")}
    assert commands["train"] == "agl_trainer.cli:train" and commands["engine"] == "agl_trainer.cli:engine"
    from agl_trainer.cli import engine, train

    assert train.name == "train" and engine.name == "engine"


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED.items()))
def test_an_old_module_path_warns_and_is_the_new_module(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(old in m and new in m for m in messages), messages


def test_the_old_policy_names_warn_and_are_the_trainers() -> None:
    """`agl_trainer.policy` was the policy trainer's module; it is now its folder, which hands out the old names."""
    import agl_trainer.policy as policy
    from agl_trainer.policy.trainer import PolicyTrainer

    with pytest.warns(DeprecationWarning, match="agl_trainer.policy.trainer"):
        assert policy.PolicyTrainer is PolicyTrainer
    with pytest.raises(AttributeError):
        policy.NoSuchName  # noqa: B018
