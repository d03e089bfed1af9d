"""A failed attempt's stored text: the message first, then the traceback, within the API's size limit."""

from __future__ import annotations

from agl.common import failure


def fail_deep(depth: int) -> None:
    if depth == 0:
        raise ValueError("the bottom")
    fail_deep(depth - 1)


def caught(depth: int) -> BaseException:
    try:
        fail_deep(depth)
    except ValueError as exc:
        return exc
    raise AssertionError("fail_deep did not fail")


def test_the_message_comes_first_and_the_traceback_splits_off() -> None:
    text = failure.describe(caught(2))
    message, trace = failure.split(text)
    assert message == "ValueError: the bottom"
    assert trace is not None and trace.startswith(failure.TRACEBACK_HEAD)
    assert trace.count("in fail_deep") == 3 and trace.rstrip().endswith("ValueError: the bottom")


def test_a_long_traceback_is_cut_in_the_middle_keeping_the_failing_frame() -> None:
    text = failure.describe(caught(500), limit=600)
    assert len(text) <= 600
    message, trace = failure.split(text)
    assert message == "ValueError: the bottom"
    assert trace is not None and "(traceback cut)" in trace
    assert 'raise ValueError("the bottom")' in trace  # the innermost frame survives
    assert "in caught" in trace  # and the outermost


def test_texts_without_a_traceback_come_back_whole() -> None:
    assert failure.split("lease expired") == ("lease expired", None)
    assert failure.split("") == ("", None)


def test_a_registered_hint_follows_the_message_of_failures_that_hold_its_marker() -> None:
    from agl.common.failure import add_hint, describe, remove_hint, split

    # a marker of its own: the AutoGen adapter, imported earlier in the same process, registers "is currently running"
    add_hint("is held by the failure test", "agl: build it inside the rollout")
    try:
        try:
            raise RuntimeError("The failure test's object is held by the failure test.")
        except RuntimeError as exc:
            text = describe(exc)
        message, trace = split(text)
        assert message.splitlines() == [
            "RuntimeError: The failure test's object is held by the failure test.",
            "agl: build it inside the rollout",
        ]
        assert trace is not None and trace.startswith("Traceback")
        assert "agl:" not in describe(ValueError("unrelated"))
    finally:
        remove_hint("is held by the failure test")
    assert "agl:" not in describe(RuntimeError("The failure test's object is held by the failure test."))
