"""`agl worker`'s options for a Ray cluster (agl.capture.ray_workers): with `--ray-address`, the command starts
`--workers` worker processes over the cluster instead of running rollouts itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

F = Callable[..., Any]

_OPTIONS = (
    click.option(
        "--ray-address",
        help="Start the workers on this Ray cluster (`auto`, or the head's host:port) instead of running rollouts here.",
    ),
    click.option(
        "--workers",
        "ray_workers",
        default=1,
        show_default=True,
        type=click.IntRange(min=1),
        help="With --ray-address: worker processes, spread over the cluster's nodes.",
    ),
    click.option(
        "--ray-resource",
        help="With --ray-address: place each worker on nodes declaring this custom resource (one unit each; e.g."
        " `ray start --resources '{\"rollout\": 8}'` on the rollout machines) instead of by CPU.",
    ),
    click.option(
        "--max-restarts",
        default=3,
        show_default=True,
        type=click.IntRange(min=0),
        help="With --ray-address: times Ray restarts a worker whose process, actor or node died.",
    ),
    click.option(
        "--log-dir",
        "ray_log_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("agl-worker-logs"),
        show_default=True,
        help="With --ray-address: each worker's log, at this folder's path on its node.",
    ),
    click.option(
        "--ray-working-dir",
        help="With --ray-address: a folder Ray uploads to every node and starts the workers in (AGENT relative to it).",
    ),
)


def ray_options(command: F) -> F:
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
