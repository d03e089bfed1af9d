"""A command-line agent, as a harness is one: reads its task from the working folder, asks the model through the
OpenAI SDK configured from its environment only (no agl in this process), writes its answer there. `--hang` starts
a child, and both write their beat (a count, every 0.1 s) to files in the folder named by `--beats`, forever: for
time-out tests (a beat that stops means the process is gone, in a sandbox's PID namespace or not).
`--sub-agents` then asks twice more as the harnesses' sub-agents do, with the header each marks them by (Claude Code's
random agent id, Codex's kind)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--hang", action="store_true")
parser.add_argument("--beats", default=None)
parser.add_argument("--sub-agents", action="store_true")
args = parser.parse_args()
BEAT = "import itertools, sys, time\nfor n in itertools.count():\n    open(sys.argv[1], 'w').write(str(n)); time.sleep(0.1)"
if args.hang:
    subprocess.Popen([sys.executable, "-c", BEAT, str(Path(args.beats) / "child")], start_new_session=True)
    print("hanging", flush=True)
    subprocess.run([sys.executable, "-c", BEAT, str(Path(args.beats) / "leader")])
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
