"""Sandboxes for what a rollout runs that the model wrote: a command-line agent (`agl.run_cli`) or a program an
evaluator executes (`agl.run_sandboxed`, `agl.sandboxed`). See docs/security.md for the threat model.

Read in the order the data flows:
- `policy`: what a sandbox allows (`Sandbox`, `Limits`), the defaults safe;
- `mounts`: what it sees of the machine (the system read-only, the program's own files, the task's paths);
- `bwrap`: whether bubblewrap can start here, and the command line of one sandbox;
- `supervisor`: the sandbox's PID 1, inside it (relays its ports, enforces limits, takes every process down);
- `llm_relay`: the host end of its one way to agl (the attempt's LLM routes, nothing else);
- `cgroups`: kernel-enforced process and memory limits where a cgroup may be made;
- `launch`: one sandboxed command on the host's side, set up, started, stopped, reported;
- `container`: the same rules in a container (podman, docker) when a task names an image;
- `kinds`: which launcher a sandbox's kind uses (bubblewrap's, or the container's);
- `run`: `run_sandboxed` and `sandboxed`, what evaluators call.
"""
