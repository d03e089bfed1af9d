"""`agl worker AGENT --k8s-manifest`: the Kubernetes manifest of N rollout workers, for users without Ray.

A Deployment of N replicas, each an `agl worker` process as on one machine (its leases and heartbeats make a pod that
dies, or is rescheduled, lose nothing: its rollouts are retried once their leases run out); Kubernetes restarts a
worker that exits (`restartPolicy: Always`, the only one a Deployment takes). The server's token comes from a Secret
(`kubectl create secret generic agl-token --from-literal=token=...`), in the container's environment, never in the
manifest or a command line. Each pod asks for the CPU and memory given; the image holds agl and the agent's code."""

from __future__ import annotations

from typing import Any


def worker_deployment(
    agent: str,
    server_url: str,
    *,
    workers: int,
    concurrency: int,
    image: str,
    secret: str = "agl-token",
    cpu: str = "1",
    memory: str = "2Gi",
    name: str = "agl-worker",
    lease_s: float = 30.0,
    heartbeat_s: float = 5.0,
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "agl"}
    command = ["agl", "worker", agent, f"--server={server_url}", f"--concurrency={concurrency}"]
    command += [f"--lease={lease_s:g}", f"--heartbeat={heartbeat_s:g}"]
    container = {
        "name": "worker",
        "image": image,
        "command": command,
        "env": [{"name": "AGL_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "replicas": workers,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "restartPolicy": "Always",
                    # a stopped worker's rollouts come back through their leases: no need to wait for it long
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                },
            },
        },
    }


def as_yaml(manifest: dict[str, Any]) -> str:
    import yaml

    return str(yaml.safe_dump(manifest, sort_keys=False))
