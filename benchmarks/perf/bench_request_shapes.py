"""Request bodies whose cost is in their elements, not their structures: six at once against a real `agl serve`.

Each shape is a ~30 MB chat-completion body (`--max-body-mb` is 32) that opens few objects and lists, so a cap on
structures lets it through to the parser: one list of 7.5M floats, one object of 2.2M keys, one list of 5M short
strings. Six of one shape are sent at once through the proxy of a fresh server, while another process polls `GET /healthz` every 20 ms
on a new connection; printed per shape: the answers, the health probe's p99 and slowest, and the server's peak RSS
growth over its RSS before the round (targets: p99 under 100 ms, growth under 300 MB). A control round sends six
bodies of one 30 MB string (read, parsed, refused for want of messages): what receiving them costs by itself. A last
round sends a real long conversation (2,000 tool calls with their results, 200 tool schemas, ~2 MB), six at once: it
must be answered.

    python benchmarks/perf/bench_request_shapes.py                              # this checkout
    python benchmarks/perf/bench_request_shapes.py --src OLD/packages/core/src  # another one's sources
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
from _common import claim_attempt, percentile, scripted_upstream, serve, status_mb

CONCURRENT = 6


def shapes() -> dict[str, bytes]:
    head = b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"x":'
    return {
        "7.5M floats": head + b"[" + b",".join([b"1.5"] * 7_500_000) + b"]}",
        "2.2M keys": head + b"{" + b",".join(b'"k%d":1' % i for i in range(2_200_000)) + b"}}",
        "5M strings": head + b"[" + b",".join([b'"ab"'] * 5_000_000) + b"]}",
        # the control: as many bytes in one string, read and parsed, refused for its lack of messages (what the
        # reception of six 30 MB bodies costs by itself)
        "control: one 30 MB string": b'{"model":"m","x":"' + b"a" * 30_000_000 + b'"}',
    }


def long_conversation(turns: int = 2_000) -> bytes:
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are an agent: use tools, then answer."}]
    for i in range(turns):
        args = json.dumps({"command": f"grep -n 'a, b: c' file{i}.py", "timeout": 30})
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": args}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        output = "12: x, y = f(a: int, b: str)\n" * 20 + json.dumps({"rows": list(range(50))})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": output})
    messages.append({"role": "user", "content": "hi"})
    props = {f"p{j}": {"type": "string", "description": "a, b: c"} for j in range(10)}
    tools = [
        {"type": "function", "function": {"name": f"t{t}", "parameters": {"type": "object", "properties": props}}}
        for t in range(200)
    ]
    return orjson.dumps({"model": "m", "max_tokens": 1, "messages": messages, "tools": tools})


_PROBE = """
import sys, time, json, httpx, select
latencies, failed = [], 0
with httpx.Client(timeout=30, headers={"connection": "close"}) as client:
    while not select.select([sys.stdin], [], [], 0.02)[0]:
        t0 = time.monotonic()
        try:
            failed += client.get(sys.argv[1]).status_code != 200
        except httpx.HTTPError:
            failed += 1
        latencies.append(time.monotonic() - t0)
print(json.dumps([latencies, failed]))
"""


class HealthProbe:
    """Polls GET /healthz every 20 ms, a new connection each time, from a process of its own (the six senders'
    threads in this one would hold its interpreter lock and delay the probe, not the server)."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/healthz"
        self.latencies: list[float] = []
        self.failed = 0

    def __enter__(self) -> HealthProbe:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, self.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self._proc.communicate("stop\n", timeout=60)
        self.latencies, self.failed = json.loads(out)


def round_of(server_url: str, pid: int, name: str, body: bytes) -> dict[str, object]:
    urls = [f"{claim_attempt(server_url)}/chat/completions" for _ in range(CONCURRENT)]
    time.sleep(0.5)
    before = status_mb(pid)
    peak = [before]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.01):
            peak[0] = max(peak[0], status_mb(pid))

    def send(url: str) -> str:
        try:
            resp = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=600)
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return f"{resp.status_code} {resp.json()['error']['message'][:90]}" if resp.is_error else str(resp.status_code)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with HealthProbe(server_url) as probe, ThreadPoolExecutor(CONCURRENT) as pool:
        t0 = time.monotonic()
        answers = Counter(pool.map(send, urls))
        took = time.monotonic() - t0
    stop.set()
    watcher.join()
    return {
        "shape": name,
        "body (MB)": round(len(body) / 1e6, 1),
        "answers": dict(answers),
        "seconds": round(took, 2),
        "health p99 (ms)": round(percentile(probe.latencies, 0.99) * 1000, 1),
        "health slowest (ms)": round(max(probe.latencies) * 1000, 1),
        "health failed": probe.failed,
        "RSS growth (MB)": round(peak[0] - before, 1),
    }


def run(src: str | None, bodies: dict[str, bytes]) -> None:
    with scripted_upstream() as upstream:
        for name, body in bodies.items():
            with serve(src, upstream=upstream) as server:  # a fresh server each: its RSS growth is its own
                assert server.proc is not None
                print(json.dumps(round_of(server.url, server.proc.pid, name, body)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", help="run the server from these sources (PYTHONPATH)")
    args = parser.parse_args()
    run(args.src, {**shapes(), "real long conversation": long_conversation()})


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    head = b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"x":'
    run(None, {"20k floats": head + b"[" + b",".join([b"1.5"] * 20_000) + b"]}", "conversation": long_conversation(20)})


if __name__ == "__main__":
    main()
