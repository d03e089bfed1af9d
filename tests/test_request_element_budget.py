"""Request and span bodies are bounded by their elements, counted in their bytes before they are parsed
(agl.server.span_caps.count_elements): one 30 MB list of floats, one object of millions of keys or millions of
strings pass a cap on objects and lists, and a span body of duplicate keys passes a count after parsing (the parser
keeps one). Real requests, whose text holds commas and colons in plenty, stay far under the budget."""

from __future__ import annotations

import json
import time

import httpx
import orjson

from agl.client import API
from agl.common.processes import ServerProcess
from agl.server.call_record import parse_chat
from agl.server.request_cost import MAX_REQUEST_ELEMENTS, structure_problem
from agl.server.span_caps import TooManySpans, check_json_containers, count_elements
from tests.test_server_faults import claim, proxy_path


def exact_elements(text: bytes) -> int:
    """The reference count: strings, and commas and colons outside strings, walked byte by byte."""
    count, inside, escaped = 0, False, False
    for byte in text:
        ch = chr(byte)
        if inside:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                inside = False
        elif ch == '"':
            inside, count = True, count + 1
        elif ch in ",:":
            count += 1
    return count


def test_the_count_skips_strings_with_their_escapes() -> None:
    docs = [
        b'{"a,:":1,"b\\\\":[1,2,"x\\"y,:"]}',
        b'["\\\\",1,2,3]',
        b'["\\\\\\"", ",,,,", 4]',
        json.dumps({"messages": [{"role": "user", "content": 'say "a, b: c", \\ then {"k": [1, 2]}, ' * 50}]}).encode(),
    ]
    for doc in docs:
        exact = exact_elements(doc)
        assert count_elements(doc, 10**9) >= exact  # the quick upper bound
        assert count_elements(doc, exact) == exact  # walked: exact up to the limit
        assert count_elements(doc, exact - 1) > exact - 1


def long_conversation(turns: int) -> bytes:
    """An agent's long context: tool calls, their results (text and JSON as text, full of commas and colons), tools."""
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are an agent: use tools, then answer."}]
    for i in range(turns):
        args = json.dumps({"command": f"grep -n 'a, b: c' file{i}.py", "timeout": 30})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": args}}
                ],
            }
        )
        output = "12: x, y = f(a: int, b: str), {'k': [1, 2, 3]}\n" * 20 + json.dumps({"rows": list(range(50))})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": output})
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{t}",
                "description": "Does one thing: well, quickly.",
                "parameters": {
                    "type": "object",
                    "properties": {f"p{j}": {"type": "string", "description": "a, b: c"} for j in range(10)},
                    "required": ["p0"],
                },
            },
        }
        for t in range(200)
    ]
    return orjson.dumps({"model": "m", "messages": messages, "tools": tools})


def test_attack_shapes_are_refused_before_parsing_and_real_requests_pass() -> None:
    floats = b'{"messages":[],"x":[' + b",".join([b"1.5"] * 7_500_000) + b"]}"
    keys = b'{"messages":[],"x":{' + b",".join(b'"k%d":1' % i for i in range(2_200_000)) + b"}}"
    strings = b'{"messages":[],"x":[' + b",".join([b'"ab"'] * 5_000_000) + b"]}"
    for raw in (floats, keys, strings):
        t0 = time.perf_counter()
        problem = structure_problem(raw)
        assert time.perf_counter() - t0 < 2.0
        assert problem is not None and f"at most {MAX_REQUEST_ELEMENTS}" in problem, problem
        assert "at least" in problem and "JSON elements" in problem
        assert parse_chat(raw) == problem
    real = long_conversation(2_000)  # ~4 MB, 4,000 messages
    assert len(real) > 2_000_000
    assert structure_problem(real) is None
    assert isinstance(parse_chat(real), dict)


def test_span_bodies_count_duplicate_keys() -> None:
    span = {
        "trace_id": "a" * 32,
        "span_id": "b" * 16,
        "name": "tool",
        "start_time": 1.0,
        "end_time": 2.0,
        "attributes": {f"k{i}": i for i in range(100)},
    }
    fine = orjson.dumps({"spans": [span] * 100})
    check_json_containers(fine, 100, what="this spans body")
    one = orjson.dumps({"spans": [span]})
    dupes = one.replace(b'"attributes":{', b'"attributes":{' + b'"a":1,' * 10_000)
    assert len(orjson.loads(dupes)["spans"][0]["attributes"]) == 101  # the parser keeps one of them
    try:
        check_json_containers(dupes, 1, what="this spans body")
    except TooManySpans as exc:
        assert "duplicate keys count" in str(exc)
    else:
        raise AssertionError("10,000 duplicate keys passed")


def test_the_server_refuses_them_with_a_400_and_a_413(server: ServerProcess) -> None:
    c = claim(server)
    floats = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[' + b",".join([b"1.5"] * 2_000_000) + b"]}"
    resp = httpx.post(
        f"{server.url}{proxy_path(c)}/chat/completions",
        content=floats,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert resp.status_code == 400 and f"at most {MAX_REQUEST_ELEMENTS}" in resp.text, resp.text
    body = {"spans": [{"trace_id": "a" * 32, "span_id": "b" * 16, "name": "x", "start_time": 1.0, "end_time": 2.0}]}
    raw = orjson.dumps(body).replace(b'"name"', b'"attributes":{' + b",".join([b'"a":1'] * 10_000) + b'},"name"')
    resp = httpx.post(f"{server.url}{API}/spans", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "duplicate keys count" in resp.text, resp.text


def test_large_bodies_are_checked_one_at_a_time_on_one_thread_and_deep_ones_still_refused() -> None:
    """Six large bodies parsed at once share one lane (`request_cost.heavy_lane`): more threads at work that holds
    the interpreter lock ran no faster and kept the event loop waiting for it; the parse skips writing a body that
    opens too few objects to nest too deep, and still refuses one that nests too deep."""
    import asyncio
    import threading

    from agl.server.call_record import off_loop_if_large

    running, peak, names = 0, 0, set()
    guard = threading.Lock()

    def parse(raw: bytes) -> dict[str, object] | str:
        nonlocal running, peak
        with guard:
            running += 1
            peak = max(peak, running)
            names.add(threading.current_thread().name)
        time.sleep(0.05)  # the lock-holding work of a real parse, without the lock
        with guard:
            running -= 1
        return parse_chat(raw)

    text = "a, b: c " * 40_000  # 320 KB: over the size parsed off the loop
    shallow = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})

    async def six() -> list[dict[str, object] | str]:
        return await asyncio.gather(*(off_loop_if_large(parse, shallow) for _ in range(6)))

    answers = asyncio.run(six())
    assert all(isinstance(a, dict) and a["messages"][0]["content"] == text for a in answers)  # type: ignore[index]
    assert peak == 1 and len(names) == 1 and next(iter(names)).startswith("agl-heavy"), (peak, names)

    deep = b'{"model":"m","messages":[{"role":"user","content":"' + text.encode() + b'","x":'
    deep += b"[" * 300 + b"]" * 300 + b"}]}"
    problem = parse_chat(deep)
    assert isinstance(problem, str) and "too deep" in problem, problem
