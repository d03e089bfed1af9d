"""`stop_processes`: SIGTERM to all, a shared grace, SIGKILL to those that ignore it; nothing left unreaped."""

from __future__ import annotations

import signal
import subprocess
import sys

from agl.common.processes import stop_processes

IGNORES_SIGTERM = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
OBEYS = "import sys, time; print('ready', flush=True); time.sleep(600)"


def started(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # its handler is in place
    return proc


def test_each_is_terminated_and_one_that_ignores_it_is_killed_after_the_grace() -> None:
    obeys, ignores, done = started(OBEYS), started(IGNORES_SIGTERM), started(OBEYS)
    done.terminate()
    done.wait()
    stop_processes([obeys, None, ignores, done], grace_s=1.0)
    assert obeys.returncode == -signal.SIGTERM
    assert ignores.returncode == -signal.SIGKILL  # reaped: returncode is set, no zombie left
    assert done.returncode == -signal.SIGTERM  # already ended: left as it was


def test_nothing_to_stop() -> None:
    stop_processes([])
    stop_processes([None])
