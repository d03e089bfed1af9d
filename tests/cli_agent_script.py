"""A command-line agent, as a harness is one: reads its task from the working folder, asks the model through the
OpenAI SDK configured from its environment only (no agl in this process), writes its answer there. `--hang` starts
a child that sleeps, writes both pids to the file named by `--pids`, and sleeps itself: for time-out tests."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import openai

parser = argparse.ArgumentParser()
parser.add_argument("--hang", action="store_true")
parser.add_argument("--pids", default=None)
args = parser.parse_args()
if args.hang:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(args.pids).write_text(f"{child.pid} {__import__('os').getpid()}")
    print("hanging", flush=True)
    time.sleep(600)
question = Path("task.txt").read_text().strip()
print(f"asking: {question}", flush=True)
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": question}])
Path("answer.txt").write_text(answer.choices[0].message.content or "")
print("done", flush=True)
