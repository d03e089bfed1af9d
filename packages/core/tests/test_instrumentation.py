"""`agl.capture.instrumentation.Instrumentor`: once however often instrumented, exact undo, clear refusal when the hooked
library is missing, never half instrumented."""

from __future__ import annotations

import functools
import logging
import threading
import types
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from agl.capture.instrumentation import Instrumentor, MissingDependency


class Library:
    def send(self, x: int) -> int:
        return x


class Child(Library):  # inherits `send`: undo must not leave a copy in its __dict__
    pass


module = types.ModuleType("fake_library")
module.helper = lambda: "helper"  # type: ignore[attr-defined]


def doubling(original: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(original)
    def send(self: Any, x: int) -> int:
        return 2 * original(self, x)

    return send


class Hooks(Instrumentor):
    calls: ClassVar[int] = 0
    fail_after_patching: ClassVar[bool] = False
    removed_by_user: ClassVar[bool] = False

    def _instrument(self) -> None:
        type(self).calls += 1
        type(self).removed_by_user = False
        self.wrap(Library, "send", doubling)
        self.wrap(Child, "send", doubling)
        self.replace(module, "helper", lambda: "agl")
        if self.fail_after_patching:
            raise RuntimeError("boom")

    def _in_place(self) -> bool:
        return not self.removed_by_user


class NeedsMissing(Instrumentor):
    dependencies: ClassVar[dict[str, str]] = {"json": "json", "agl_no_such_library": "agl-no-such-library"}

    def _instrument(self) -> None:
        self.replace(module, "helper", lambda: "patched anyway")


@pytest.fixture(autouse=True)
def clean() -> Any:
    originals = (vars(Library)["send"], dict(vars(Child)), module.helper)
    yield
    Hooks().uninstrument()
    Hooks.calls, Hooks.fail_after_patching, Hooks.removed_by_user = 0, False, False
    assert (vars(Library)["send"], dict(vars(Child)), module.helper) == originals


def test_one_instance_per_class() -> None:
    assert Hooks() is Hooks() and NeedsMissing() is not Hooks()  # type: ignore[comparison-overlap]


def test_instrument_twice_is_instrument_once() -> None:
    Hooks().instrument()
    wrapped = Library.send
    Hooks().instrument()
    assert Hooks.calls == 1 and Library.send is wrapped and Hooks().is_instrumented()
    assert Library().send(3) == 6 and Child().send(3) == 12  # Child's wraps Library's wrapper: both hooks run
    assert len(Hooks().patches) == 3


def test_uninstrument_restores_the_exact_originals_and_twice_is_harmless() -> None:
    original = vars(Library)["send"]
    helper = module.helper
    Hooks().instrument()
    assert "send" in vars(Child)
    Hooks().uninstrument()
    Hooks().uninstrument()
    assert vars(Library)["send"] is original and module.helper is helper
    assert "send" not in vars(Child)  # it had none of its own: removed, not set to a copy
    assert not Hooks().is_instrumented() and Hooks().patches == ()
    Hooks().instrument()  # and it can be instrumented afresh
    assert Hooks.calls == 2 and Library().send(1) == 2


def test_missing_dependency_is_named_and_nothing_is_patched() -> None:
    helper = module.helper
    with pytest.raises(MissingDependency, match=r"agl_no_such_library \(pip install agl-no-such-library\)") as e:
        NeedsMissing().instrument()
    assert "json" not in str(e.value)  # only what is missing is named
    assert isinstance(e.value, ImportError)
    assert module.helper is helper and not NeedsMissing().is_instrumented()


def test_a_failure_while_instrumenting_undoes_what_was_done() -> None:
    original = vars(Library)["send"]
    Hooks.fail_after_patching = True
    with pytest.raises(RuntimeError, match="boom"):
        Hooks().instrument()
    assert vars(Library)["send"] is original and "send" not in vars(Child)
    assert not Hooks().is_instrumented()


def test_hooks_removed_by_someone_else_are_put_back() -> None:
    Hooks().instrument()
    Hooks.removed_by_user = True
    assert not Hooks().is_instrumented()
    Hooks().instrument()
    assert Hooks.calls == 2 and Hooks().is_instrumented()
    assert Library().send(1) == 2  # undone before being redone: wrapped once, not twice


def test_undo_leaves_a_later_patch_by_someone_else_in_place(caplog: pytest.LogCaptureFixture) -> None:
    original = vars(Library)["send"]
    Hooks().instrument()
    theirs = doubling(Library.send)
    Library.send = theirs  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="agl.capture.instrumentation")
    Hooks().uninstrument()
    assert vars(Library)["send"] is theirs
    assert "Library.send was replaced after Hooks patched it" in caplog.text
    Library.send = original  # type: ignore[method-assign]


def test_concurrent_instrument_calls_patch_once() -> None:
    barrier = threading.Barrier(8)

    def go() -> None:
        barrier.wait()
        Hooks().instrument()

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Hooks.calls == 1 and Library().send(5) == 10
