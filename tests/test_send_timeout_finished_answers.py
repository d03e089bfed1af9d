"""`agl serve --send-timeout` cuts a client that never reads a finished, non-streamed answer, as it cuts one that stops
reading a stream: once its answer is written the connection is closing (keep-alive's end, or `connection: close`),
and a close waits to flush what the client never takes, holding the answer's bytes for as long as the client
keeps its socket open. Against a real `agl serve` over a raw socket that never reads."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agl.common.processes import start_server
from tests.conftest import wait_until
from tests.test_server_faults import claim, proxy_path
from tests.test_server_phases import connect


# keep-alive: a send timeout past uvicorn's keep-alive (5 s), which closes the connection while the answer waits
@pytest.mark.parametrize(("close", "send_timeout"), [(False, 7), (True, 1)], ids=["keep-alive", "connection-close"])
def test_a_client_that_never_reads_a_finished_answer_is_cut(
    tmp_path: Path, upstream: str, close: bool, send_timeout: int
) -> None:
    server = start_server(tmp_path / "run", upstream=upstream, extra_args=[f"--send-timeout={send_timeout}"])
    cut = f"read none of its answer for {send_timeout} s"
    try:
        c = claim(server)
        # the scripted upstream echoes the user's text: an answer of some MB, more than the sockets buffer
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi " * 40_000}]}).encode()
        sock = connect(server, rcvbuf=4096)
        sock.sendall(
            f"POST {proxy_path(c)}/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n".encode()
            + (b"connection: close\r\n" if close else b"")
            + b"\r\n"
            + body
        )
        t0 = time.monotonic()
        # reads nothing, keeps its socket open: cut once the send timeout has passed
        wait_until(lambda: cut in server.log_path.read_text(), 25, "the cut of the client that never reads")
        assert time.monotonic() - t0 < send_timeout + 10
        sock.settimeout(5)
        got = b""
        try:  # what the kernels held, then the reset: the answer never comes whole
            while chunk := sock.recv(1 << 20):
                got += chunk
        except ConnectionResetError:
            pass
        sock.close()
        head, _, answer = got.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert len(answer) < length, (len(answer), length)
    finally:
        server.stop()
