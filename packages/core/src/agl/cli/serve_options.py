"""Option groups of `agl serve` (agl.cli.main): what an upstream's answer may cost, who may add engines and
which (agl.server.engine_admission), and whose sampling the run owns (agl.server.run_sampling)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from agl.learn.selection import AgentSelection

F = Callable[..., Any]


def _group(*options: Callable[[F], F]) -> Callable[[F], F]:
    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


upstream_limits = _group(
    click.option(
        "--upstream-max-answer-mb",
        type=click.FloatRange(min=0.001),
        default=64.0,
        show_default=True,
        help="Largest answer read from the upstream (502 past it, the call stored with the error).",
    ),
    click.option(
        "--upstream-max-event-mb",
        type=click.FloatRange(min=0.001),
        default=16.0,
        show_default=True,
        help="Largest event of an upstream's streamed answer (the stream is cut past it, the call stored with the error).",
    ),
    click.option(
        "--upstream-max-stream-mb",
        type=click.FloatRange(min=0.001),
        default=64.0,
        show_default=True,
        help="Most bytes of one streamed answer: past it the stream is cut and the call stored not trainable.",
    ),
    click.option(
        "--upstream-max-stream-tokens",
        type=click.IntRange(min=1),
        default=131_072,
        show_default=True,
        help="Most tokens of one streamed answer whose request sets no max_tokens (with max_tokens: that, and 64 more),"
        " past which the stream is cut and the call stored not trainable.",
    ),
)

engine_admission = _group(
    click.option(
        "--admin-token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="A file holding a token that opens the engine routes (/api/v1/proxy/engines) of a server without --token;"
        " a trainer gives it to the server it starts. Without either, engines are changed only on the command line.",
    ),
    click.option(
        "--engine-host",
        "engine_hosts",
        multiple=True,
        help="A host engines may be added on at run time (repeatable); without it any host but link-local addresses.",
    ),
    click.option(
        "--api-key-to-added-engines",
        is_flag=True,
        default=False,
        help="Send --upstream-api-key to engines added at run time too (by default only to those given with --upstream).",
    ),
)


sampling_ownership = _group(
    click.option(
        "--own-sampling-for",
        "own_sampling_for",
        metavar="AGENTS",
        help="Sample these agents' training calls at --temperature, without their top-p, top-k, penalties or logit"
        " bias, whatever they ask ('*': every agent; names or patterns as in --agents): the trainer owns the"
        " sampling. agl train sets it to its selection.",
    ),
)


def run_selection(value: str) -> AgentSelection:
    """`--own-sampling-for`'s agents: as a training selection reads them ('*' or empty: every agent)."""
    from agl.learn.selection import AgentSelection

    try:
        return AgentSelection.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--own-sampling-for") from exc
