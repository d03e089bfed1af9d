"""`agl engine` (and, later, `agl train`): commands agl-trainer adds to the `agl` command line."""

from __future__ import annotations

import logging
import socket

import click


@click.command()
@click.option(
    "--model",
    default="bundled",
    show_default=True,
    help="A local Hugging Face model folder, or 'bundled' for SmolLM2-135M-Instruct.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int, help="0 picks a free port.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:1, ... or auto.")
@click.option("--max-batch", default=8, show_default=True, type=int, help="Requests decoded together.")
@click.option("--served-model", default="agl-policy", show_default=True, help="The model name it answers to.")
@click.option(
    "--log-level", default="warning", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def engine(model: str, host: str, port: int, device: str, max_batch: int, served_model: str, log_level: str) -> None:
    """Serve a model with the embedded engine behind an OpenAI-compatible API that returns exact token ids
    (point `agl serve --upstream` at it). Prints `AGL_ENGINE_READY <base url>` once it accepts requests."""
    import uvicorn

    from agl_trainer.engine import Engine
    from agl_trainer.models import load_model, resolve_model
    from agl_trainer.serving import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise click.ClickException("the engine has no authentication: bind it to loopback and reach it via agl serve")
    try:
        path = resolve_model(model)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc
    llm, tokenizer = load_model(path, device=device)
    eng = Engine(llm, tokenizer, max_batch=max_batch).start()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    bound_host, bound_port = sock.getsockname()[:2]
    click.echo(f"AGL_ENGINE_READY http://{bound_host}:{bound_port}/v1", err=False)
    click.echo(f"model {path} on {eng.device}, batches of up to {max_batch}", err=True)
    config = uvicorn.Config(create_app(eng, served_model), log_level=log_level, access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        eng.close()
