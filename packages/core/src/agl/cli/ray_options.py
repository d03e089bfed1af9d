"""`agl worker`'s options for a cluster: with `--ray-address`, the command starts `--workers` worker processes over
a Ray cluster instead of running rollouts itself (agl.capture.ray_workers); with `--k8s-manifest`, it prints the
Kubernetes manifest of that many workers (agl.capture.k8s_manifest)."""

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
        help="With --ray-address or --k8s-manifest: worker processes, spread over the cluster's nodes.",
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
        "--k8s-manifest",
        is_flag=True,
        help="Print the Kubernetes manifest (a Deployment) of --workers workers and exit; the token from a Secret.",
    ),
    click.option("--k8s-image", help="--k8s-manifest: the image with agl and the agent's code."),
    click.option("--k8s-secret", default="agl-token", show_default=True, help="--k8s-manifest: the token's Secret."),
    click.option("--k8s-cpu", default="1", show_default=True, help="--k8s-manifest: CPU each worker asks for."),
    click.option("--k8s-memory", default="2Gi", show_default=True, help="--k8s-manifest: memory of each worker."),
    click.option(
        "--ray-working-dir",
        help="With --ray-address: a folder Ray uploads to every node and starts the workers in (AGENT relative to it).",
    ),
)


def ray_options(command: F) -> F:
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def k8s_manifest(agent: str, server_url: str, given: dict[str, Any], on_cluster: dict[str, Any]) -> str:
    """The manifest `--k8s-manifest` prints, as YAML; a missing `--k8s-image` is a usage error."""
    from agl.capture.k8s_manifest import as_yaml, worker_deployment

    if not on_cluster["k8s_image"]:
        raise click.UsageError("--k8s-manifest needs --k8s-image: the image with agl and the agent's code")
    manifest = worker_deployment(
        agent,
        server_url,
        workers=on_cluster["ray_workers"],
        concurrency=given["concurrency"],
        image=on_cluster["k8s_image"],
        secret=on_cluster["k8s_secret"],
        cpu=on_cluster["k8s_cpu"],
        memory=on_cluster["k8s_memory"],
        lease_s=given["lease_s"],
        heartbeat_s=given["heartbeat_s"],
    )
    return as_yaml(manifest)
