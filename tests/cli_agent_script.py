"""A command-line agent, as a harness is one: reads its task from the working folder, asks the model through the
OpenAI SDK configured from its environment only (no agl in this process), writes its answer there. `--hang` starts
a child that sleeps, writes both pids to the file named by `--pids`, and sleeps itself: for time-out tests.
`--sub-agents` then asks twice more as the harnesses' sub-agents do, with the header each marks them by (Claude Code's
random agent id, Codex's kind)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--hang", action="store_true")
parser.add_argument("--pids", default=None)
parser.add_argument("--sub-agents", action="store_true")
args = parser.parse_args()
if args.hang:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(args.pids).write_text(f"{child.pid} {__import__('os').getpid()}")
    print("hanging", flush=True)
    time.sleep(600)
# imported after --hang's branch: the time-out test's 3 s must not go on importing it on a busy machine
import openai  # noqa: E402

question = Path("task.txt").read_text().strip()
print(f"asking: {question}", flush=True)
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": question}])
Path("answer.txt").write_text(answer.choices[0].message.content or "")
if args.sub_agents:
    for marker in ({"x-claude-code-agent-id": "f3a9c2d1"}, {"x-openai-subagent": "review"}):
        question = f"as {next(iter(marker))}"
        client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": question}], extra_headers=marker
        )
print("done", flush=True)
