"""The `agl` command line: serve, worker, enqueue, rollouts, show, export."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from agl._version import __version__
from agl.cli.ray_options import k8s_manifest, ray_options
from agl.cli.secrets import forbid_dumping, read_token_file, token_options
from agl.cli.serve_options import engine_admission, run_selection, sampling_ownership, upstream_limits
from agl.learn.selection import AgentSelection

log = logging.getLogger("agl.worker")

SERVER_OPTION = click.option(
    "--server",
    "server_url",
    envvar="AGL_SERVER_URL",
    default="http://127.0.0.1:8765",
    show_default=True,
    help="URL of the agl server (env AGL_SERVER_URL).",
)
TOKEN_OPTION = token_options  # --token and --token-file


def _client(server_url: str, token: str | None) -> Any:
    from agl.client import Client

    return Client(server_url, token=token)


def _fail(message: str) -> NoReturn:
    raise click.ClickException(message)


class _PluginGroup(click.Group):
    """Built-in commands plus those other agl distributions register under the `agl.commands` entry-point
    group (agl-trainer adds `engine` and `train`); a plugin is imported only when its command runs."""

    def _plugins(self) -> dict[str, Any]:
        from importlib.metadata import entry_points

        return {ep.name: ep for ep in entry_points(group="agl.commands")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        plugin = self._plugins().get(cmd_name)
        if plugin is None:
            return None
        loaded = plugin.load()
        return loaded if isinstance(loaded, click.Command) else None


@click.group(cls=_PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agl")
def cli() -> None:
    """agl: train the LLM inside any agent with reinforcement learning.

    Start a server (`agl serve`), run your agent in workers (`agl worker`), enqueue tasks, and look at what
    happened (`agl rollouts`, `agl show`, `agl export`).
    """


@cli.command()
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs/default"),
    show_default=True,
    help="Folder of the run; the store is RUN_DIR/agl.sqlite (reopened if present).",
)
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind. Anything but loopback requires --token."
)
@click.option("--port", default=8765, show_default=True, type=int, help="Port to bind (0 picks a free one).")
@TOKEN_OPTION
@click.option(
    "--upstream",
    "upstreams",
    envvar="AGL_UPSTREAM_URL",
    multiple=True,
    help="OpenAI-compatible base URL the LLM proxy forwards to, e.g. http://127.0.0.1:8000/v1 (vLLM). Repeatable:"
    " engines serving the same model (vLLM on several nodes), each call going to the least busy one, every call of"
    " an attempt to the same one while it answers.",
)
@click.option("--upstream-model", default=None, help="Model name to ask the upstream for (replaces the agent's).")
@click.option(
    "--upstream-api-key",
    envvar="AGL_UPSTREAM_API_KEY",
    default=None,
    help="API key for the upstream (env AGL_UPSTREAM_API_KEY).",
)
@click.option(
    "--token-ids",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Ask the upstream for exact token ids (vLLM's return_token_ids). 'auto' stops asking when the"
    " upstream rejects the parameter (hosted APIs); such calls are stored as not trainable.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Sampling temperature of calls whose agent sets none (always sent to the upstream and stored with the"
    " call: the trainer computes log-probs at the temperature each response was sampled with).",
)
@click.option(
    "--eval-temperature",
    type=float,
    default=None,
    help="Send every call of an evaluation rollout with this temperature (e.g. 0: greedy), whatever the agent asks.",
)
@sampling_ownership
@click.option(
    "--upstream-timeout",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds the proxy waits for the upstream's next bytes before failing the call.",
)
@click.option(
    "--upstream-connections",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Connections to the upstream held at once; calls past it wait for one (up to --upstream-timeout).",
)
@upstream_limits
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="A host name this server answers to besides localhost and its bound address (repeatable); requests"
    " with any other Host header are refused, which keeps web pages from reaching it by DNS rebinding.",
)
@click.option("--served-model", default="agl-policy", show_default=True, help="Model name agents are told to use.")
@click.option(
    "--max-body-mb", default=32.0, show_default=True, type=float, help="Largest request body accepted (413 past it)."
)
@click.option(
    "--max-request-structures",
    default=131_072,
    show_default=True,
    type=click.IntRange(min=1),
    help="JSON objects and lists one proxied request body may open (400 past it): parsing a million holds the"
    " server for about a second.",
)
@click.option(
    "--max-spans-per-request",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Spans one OTLP export request may hold (413 past it).",
)
@click.option(
    "--max-header-kb",
    default=64.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Largest request line plus headers accepted, and largest trailers (with chunk lines) of a chunked body"
    " (431 past it).",
)
@click.option(
    "--header-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a request's line and headers may take to arrive (408 past it).",
)
@click.option(
    "--body-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a request's body (trailers included) may take to arrive after its headers (408 past it).",
)
@click.option(
    "--send-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a client may take none of its answer once the server's buffers for it are full; past it the"
    " connection is dropped (a proxied call is stored as abandoned).",
)
@click.option(
    "--hold-drain-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a trainer's hold on new LLM calls may keep them waiting while the calls in flight finish; past"
    " it the calls flow again and the trainer tries later.",
)
@click.option(
    "--max-connections",
    default=None,
    type=click.IntRange(min=1),
    help="Open connections held at once (default: from the open-file limit). At the limit, connections stalled"
    " in their headers or body are closed first, then new ones get 503.",
)
@click.option(
    "--max-abs-reward",
    default=1000.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Rewards are accepted in [-M, M]: one outside (or not finite), reported through the REST API or with an"
    " attempt's completion, is refused with 400 and nothing of its request is stored.",
)
@engine_admission
@click.option(
    "--log-level", default="warning", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def serve(
    run_dir: Path,
    host: str,
    port: int,
    token: str | None,
    upstreams: tuple[str, ...],
    upstream_model: str | None,
    upstream_api_key: str | None,
    token_ids: str,
    temperature: float,
    eval_temperature: float | None,
    own_sampling_for: str | None,
    upstream_timeout: float,
    upstream_connections: int,
    upstream_max_answer_mb: float,
    upstream_max_event_mb: float,
    upstream_max_stream_mb: float,
    upstream_max_stream_tokens: int,
    allowed_hosts: tuple[str, ...],
    served_model: str,
    max_body_mb: float,
    max_request_structures: int,
    max_spans_per_request: int,
    max_header_kb: float,
    header_timeout: float,
    body_timeout: float,
    send_timeout: float,
    hold_drain_timeout: float,
    max_connections: int | None,
    max_abs_reward: float,
    admin_token_file: Path | None,
    engine_hosts: tuple[str, ...],
    api_key_to_added_engines: bool,
    log_level: str,
) -> None:
    """Start the agl server: store REST API (/api/v1, OpenAPI at /openapi.json), OTLP/HTTP receiver
    (/v1/traces) and the LLM proxy (/rollout/{id}/attempt/{id}/v1/chat/completions).

    Prints `AGL_SERVER_READY <url>` once it accepts connections.
    """
    from agl.server.app import serve as run_server
    from agl.server.connections import ConnectionLimits
    from agl.server.proxy import UpstreamConfig
    from agl.server.settings import ServerSettings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    forbid_dumping()  # no process of this user reads the token from /proc/<pid>/environ (agl.cli.secrets)
    settings = ServerSettings(
        run_dir=run_dir,
        host=host,
        port=port,
        token=token,
        served_model=served_model,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
        allowed_hosts=allowed_hosts,
        max_spans_per_request=max_spans_per_request,
        hold_drain_max_s=hold_drain_timeout,
        max_abs_reward=max_abs_reward,
        admin_token=read_token_file(admin_token_file) if admin_token_file else None,
        engine_hosts=engine_hosts,
        api_key_to_added_engines=api_key_to_added_engines,
        connections=ConnectionLimits(
            max_head_bytes=int(max_header_kb * 1024),
            head_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            send_timeout_s=send_timeout,
            max_connections=max_connections,
        ),
        upstream=UpstreamConfig(
            base_url=upstreams[0] if upstreams else None,
            more_urls=tuple(upstreams[1:]),
            api_key=upstream_api_key,
            model=upstream_model,
            token_ids=token_ids,
            temperature=temperature,
            eval_temperature=eval_temperature,
            own_sampling=None if own_sampling_for is None else run_selection(own_sampling_for),
            timeout_s=upstream_timeout,
            max_connections=upstream_connections,
            max_answer_bytes=int(upstream_max_answer_mb * 1024 * 1024),
            max_event_bytes=int(upstream_max_event_mb * 1024 * 1024),
            max_stream_bytes=int(upstream_max_stream_mb * 1024 * 1024),
            max_stream_tokens=upstream_max_stream_tokens,
            max_request_structures=max_request_structures,
        ),
    )

    def ready(url: str) -> None:
        click.echo(f"AGL_SERVER_READY {url}", err=False)
        click.echo(f"store: {run_dir / 'agl.sqlite'}  upstream: {', '.join(upstreams) or '(none)'}", err=True)
        click.echo(f"dashboard: {url}/ui" + ("?token=<token>" if token else ""), err=True)
        sys.stdout.flush()

    try:
        run_server(settings, log_level=log_level, on_ready=ready)
    except (ValueError, OSError) as exc:
        _fail(str(exc))


def load_agent(spec: str) -> Any:
    """`package.module:function` → the function (`path/to/file.py:function` too, inside a package or not)."""
    from agl.capture.agent_loader import AgentLoadError
    from agl.capture.agent_loader import load_agent as load

    try:
        return load(spec)
    except AgentLoadError as exc:
        _fail(str(exc))


def _run_worker(
    agent_spec: str,
    server_url: str,
    token: str | None,
    options: dict[str, Any],
    max_rollouts: int | None,
    idle_exit_s: float | None,
) -> dict[str, int]:
    from agl.capture.runner import Runner, RunnerOptions

    forbid_dumping()  # in each worker process (the flag does not pass to a spawned one): see agl.cli.secrets
    runner = Runner(load_agent(agent_spec), server_url, token=token, options=RunnerOptions(**options))
    stats = runner.run(max_rollouts=max_rollouts, idle_exit_s=idle_exit_s)
    return {key: getattr(stats, key) for key in ("succeeded", "failed", "timeout", "superseded", "discarded")}


@cli.command()
@click.argument("agent")
@SERVER_OPTION
@TOKEN_OPTION
@click.option("-n", "--concurrency", default=4, show_default=True, type=int, help="Rollouts run at once per process.")
@click.option("-p", "--processes", default=1, show_default=True, type=int, help="Worker processes to start.")
@click.option("--max-rollouts", default=None, type=int, help="Exit after this many rollouts (per process).")
@click.option("--idle-exit", "idle_exit_s", default=None, type=float, help="Exit after this many seconds without work.")
@click.option(
    "--lease",
    "lease_s",
    default=30.0,
    show_default=True,
    type=float,
    help="Lease of an attempt in seconds; a worker that stops heartbeating loses its rollouts after it.",
)
@click.option("--heartbeat", "heartbeat_s", default=5.0, show_default=True, type=float, help="Heartbeat interval (s).")
@click.option(
    "--keep-openai-env",
    is_flag=True,
    help="Leave OPENAI_BASE_URL, OPENAI_API_BASE and OPENAI_API_KEY as they are (by default they point the OpenAI"
    " SDK, and every framework built on it, at this run's LLM URL, so an unchanged app's calls reach agl).",
)
@ray_options
@click.option(
    "--log-level", default="warning", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def worker(
    agent: str,
    server_url: str,
    token: str | None,
    concurrency: int,
    processes: int,
    max_rollouts: int | None,
    idle_exit_s: float | None,
    lease_s: float,
    heartbeat_s: float,
    keep_openai_env: bool,
    log_level: str,
    **on_ray: Any,
) -> None:
    """Run AGENT (`module:function` decorated with @agl.rollout) on rollouts claimed from the server (with
    --ray-address: --workers such processes over a Ray cluster)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if heartbeat_s >= lease_s:
        _fail(f"--heartbeat ({heartbeat_s}) must be shorter than --lease ({lease_s})")
    forbid_dumping()  # this process holds the token too, whether it runs the rollouts or starts processes that do
    if on_ray["k8s_manifest"]:
        click.echo(k8s_manifest(agent, server_url, locals(), on_ray), nl=False)
        return
    if on_ray["ray_address"]:  # the processes run on the cluster's nodes instead (agl.capture.ray_workers)
        from agl.capture.ray_workers import run_on_ray, worker_options_of

        raise SystemExit(run_on_ray(agent, server_url, token, **worker_options_of(locals(), on_ray)))
    if token:  # for the in-process helpers that read it (agl.configure_otel); never passed to a command it runs
        os.environ["AGL_TOKEN"] = token
    from agl.capture.tracing.context import fixed_llm_base_url
    from agl.protocol import ENV_LLM_BASE_URL

    # before the agent's module is imported: a client it builds at import time can read the run's LLM URL (the
    # worker processes spawned below inherit it)
    llm_url = fixed_llm_base_url(server_url)
    os.environ[ENV_LLM_BASE_URL] = llm_url
    if not keep_openai_env:
        from agl.capture.worker_env import point_sdks_at

        point_sdks_at(llm_url)
    from agl.capture.answer_caches import quiet_framework_env

    quiet_framework_env()
    load_agent(agent)  # fail fast with a clear message before any process starts
    options = {"concurrency": concurrency, "lease_s": lease_s, "heartbeat_s": heartbeat_s}
    args = (agent, server_url, token, options, max_rollouts, idle_exit_s)
    if processes <= 1:
        stats = _run_worker(*args)
    else:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
            results = [f.result() for f in [pool.submit(_run_worker, *args) for _ in range(processes)]]
        stats = {k: sum(r[k] for r in results) for k in results[0]}
    click.echo(json.dumps(stats))


@cli.command()
@click.argument("tasks_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@SERVER_OPTION
@TOKEN_OPTION
@click.option("-n", "--group-size", "n", default=1, show_default=True, type=int, help="Rollouts per task.")
@click.option("--mode", type=click.Choice(["train", "eval"]), default="train", show_default=True)
@click.option("--max-attempts", default=3, show_default=True, type=int)
@click.option("--timeout", "timeout_s", default=None, type=float, help="Per-rollout timeout in seconds.")
def enqueue(
    tasks_file: Path, server_url: str, token: str | None, n: int, mode: str, max_attempts: int, timeout_s: float | None
) -> None:
    """Enqueue the tasks of TASKS_FILE (JSONL: one task input per line, or {"id":..., "input":...})."""
    from agl.schema import TaskIn

    tasks = []
    for lineno, line in enumerate(tasks_file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            _fail(f"{tasks_file}:{lineno}: not valid JSON ({exc})")
        if isinstance(row, dict) and "input" in row:
            tasks.append(TaskIn(input=row["input"], id=row.get("id"), metadata=row.get("metadata", {})))
        else:
            tasks.append(TaskIn(input=row))
    with _client(server_url, token) as client:
        count = sum(
            len(client.enqueue(t, n=n, mode=mode, max_attempts=max_attempts, timeout_s=timeout_s)) for t in tasks
        )
    click.echo(f"enqueued {count} rollouts of {len(tasks)} tasks")


@cli.command()
@SERVER_OPTION
@TOKEN_OPTION
@click.option("--status", type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"]), default=None)
@click.option("--step", type=int, default=None, help="Only rollouts of this training step.")
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--offset", default=0, show_default=True, type=int)
def rollouts(server_url: str, token: str | None, status: str | None, step: int | None, limit: int, offset: int) -> None:
    """List rollouts with their status, attempts and final reward."""
    from rich.console import Console
    from rich.table import Table

    from agl.schema import ALL_BYPASSED, all_bypassed

    with _client(server_url, token) as client:
        items, total = client.list_rollouts(status=status, step=step, limit=limit, offset=offset)
        counts = client.stats()["rollouts_by_status"]
        # whether anything was recorded, for the few rollouts whose calls went elsewhere (the list has no counts)
        everything_bypassed = {
            r.id for r in items if r.bypassed_llm_calls and all_bypassed(r, len(client.rollout_detail(r.id).llm_calls))
        }
    table = Table(
        title=f"rollouts {offset + 1}-{offset + len(items)} of {total}  "
        + "  ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    )
    for col in ("rollout", "task", "status", "attempts", "reward", "mode", "step", "error"):
        table.add_column(col, no_wrap=col != "error")  # ids are copied from here: never cut them
    colour = {"succeeded": "green", "failed": "red", "running": "yellow", "queued": "cyan", "cancelled": "magenta"}
    for r in items:
        table.add_row(
            r.id,
            r.task_id,
            f"[{colour[r.status.value]}]{r.status.value}[/]",
            f"{r.attempt_count}/{r.max_attempts}",
            "-" if r.final_reward is None else f"{r.final_reward:g}",
            r.mode,
            "" if r.step is None else str(r.step),
            (f"[bold red]⚠ {ALL_BYPASSED} ({r.bypassed_llm_calls})[/] " if r.id in everything_bypassed else "")
            + (
                f"[bold red]⚠ {r.bypassed_llm_calls} LLM call(s) bypassed agl[/] "
                if r.bypassed_llm_calls and r.id not in everything_bypassed
                else ""
            )
            + (r.error or "")[:60],
        )
    Console(width=max(Console().width, 140)).print(table)


@cli.command()
@click.argument("rollout_id")
@SERVER_OPTION
@TOKEN_OPTION
@click.option("--full", is_flag=True, help="Show every attempt and message previews.")
@click.option("--json", "as_json", is_flag=True, help="Print the stored records as JSON instead.")
def show(rollout_id: str, server_url: str, token: str | None, full: bool, as_json: bool) -> None:
    """Show one rollout as a tree: attempts, agents, LLM calls with token counts, tool spans, rewards."""
    from agl.client import NotFound

    with _client(server_url, token) as client:
        try:
            detail = client.rollout_detail(rollout_id)
        except NotFound as exc:
            _fail(exc.message)
    if as_json:
        click.echo(detail.model_dump_json(indent=2))
        return
    from rich.console import Console

    from agl.cli.show import render_rollout

    Console().print(render_rollout(detail, full=full))


@cli.command()
@SERVER_OPTION
@TOKEN_OPTION
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSONL file to write (default: standard output).",
)
@click.option("--step", type=int, default=None, help="Only rollouts of this training step.")
@click.option("--all-calls", is_flag=True, help="Also export calls that are not trainable (no token ids, errors).")
@click.option(
    "--agents",
    default=None,
    help="Export the transitions this agent selection keeps (names or glob patterns, comma-separated, as "
    "AGL_TRAIN_AGENTS), built as agl train builds them, and show per agent what it keeps and drops.",
)
def export(
    server_url: str, token: str | None, output: Path | None, step: int | None, all_calls: bool, agents: str | None
) -> None:
    """Export the LLM calls of finished rollouts (final attempts only) as JSONL, ready to become transitions;
    with --agents, the transitions a selection keeps."""
    if agents is not None and all_calls:
        _fail("--all-calls exports stored calls; --agents exports the transitions a selection keeps: give one")
    try:
        selection = None if agents is None else AgentSelection.parse(agents)
    except ValueError as exc:
        _fail(str(exc))
    with _client(server_url, token) as client:
        out = output.open("wb") if output else sys.stdout.buffer
        count = 0
        try:
            if selection is not None:
                from rich.console import Console

                from agl.cli.export import export_transitions, print_summary

                stats = export_transitions(client, selection, out, step=step)
                print_summary(selection, stats, Console(stderr=True))
                return
            for line in client.export_llm_calls(step=step, trainable_only=not all_calls):
                out.write(line.encode() + b"\n")
                count += 1
        finally:
            if output:
                out.close()
    click.echo(f"exported {count} LLM calls" + (f" to {output}" if output else ""), err=True)


def main() -> None:
    cli(prog_name="agl")


if __name__ == "__main__":
    main()
