"""A harness's sub-agent calls through an agent-named attempt URL are stored under a name of their own
(agl.server.fixed_url.sub_agent_label): the middleware rewrites the request the proxy then sees."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote

import pytest

from agl.protocol import HEADER_AGENT, HEADER_ATTEMPT_ID, HEADER_ROLLOUT_ID
from agl.server.fixed_url import FixedUrlMiddleware


def seen_by_proxy(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The scope the app behind the middleware gets for a request to `path` with `headers`."""
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(scope)

    scope = {"type": "http", "path": path, "raw_path": path.encode(), "headers": headers}
    asyncio.run(FixedUrlMiddleware(app)(scope, None, None))
    return seen


def agent_of(scope: dict[str, Any]) -> str | None:
    values = [v for k, v in scope["headers"] if k == HEADER_AGENT.encode()]
    assert len(values) <= 1  # the URL's name replaces any agent header the harness sent
    return unquote(values[0].decode()) if values else None


URL = "/rollout/ro-1/attempt/at-1/agent/claude-code/v1/messages"


def test_the_harness_s_own_calls_keep_the_url_s_name() -> None:
    scope = seen_by_proxy(URL, [(b"x-api-key", b"k"), (HEADER_AGENT.encode(), b"spoofed")])
    assert scope["path"] == "/rollout/ro-1/attempt/at-1/v1/messages"
    assert agent_of(scope) == "claude-code"


def test_claude_code_s_sub_agent_is_one_name_whatever_its_random_id() -> None:
    for agent_id in (b"a1b2c3", b"zz-other-id"):
        scope = seen_by_proxy(URL, [(b"x-claude-code-agent-id", agent_id)])
        assert agent_of(scope) == "claude-code/subagent"


@pytest.mark.parametrize(
    ("kind", "stored"),
    [
        (b"review", "codex/review"),
        (b"collab.worker_2", "codex/collab.worker_2"),
        (b"../../etc", "codex/subagent"),  # a path cannot reshape the name
        (b"two words", "codex/subagent"),
        (b"x" * 65, "codex/subagent"),
        (b"", "codex/subagent"),
    ],
)
def test_codex_s_sub_agent_is_named_by_its_kind_when_that_is_a_plain_label(kind: bytes, stored: str) -> None:
    scope = seen_by_proxy("/rollout/ro-1/attempt/at-1/agent/codex/v1/responses", [(b"x-openai-subagent", kind)])
    assert agent_of(scope) == stored


def test_the_markers_mean_nothing_outside_an_agent_named_url() -> None:
    # the fixed URL with the hook's headers: the hook's agent header is kept as sent
    headers = [
        (HEADER_ROLLOUT_ID.encode(), b"ro-1"),
        (HEADER_ATTEMPT_ID.encode(), b"at-1"),
        (HEADER_AGENT.encode(), b"writer"),
        (b"x-openai-subagent", b"review"),
    ]
    scope = seen_by_proxy("/v1/chat/completions", headers)
    assert scope["path"] == "/rollout/ro-1/attempt/at-1/v1/chat/completions"
    assert agent_of(scope) == "writer"
