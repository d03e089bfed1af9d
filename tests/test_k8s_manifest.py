"""`agl worker --k8s-manifest`: the Deployment of N workers, checked against Kubernetes' own schema (1.37, strict)
by a pinned validator; the token comes from a Secret and is in no field; a bad manifest fails the same check. Not run
on a cluster here: no Kubernetes on these machines."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S_VERSION = "1.37.0"


def manifest(*flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agl.cli.main", "worker", "my_agent.py:solve", "--server=http://agl:8765"]
    return subprocess.run([*command, *flags], capture_output=True, text=True, timeout=120)


def test_the_manifest_is_a_valid_deployment_of_n_workers_with_the_token_from_a_secret() -> None:
    done = manifest("--k8s-manifest", "--k8s-image=ghcr.io/me/agent:1", "--workers=6", "-n", "8", "--token=secret-x")
    assert done.returncode == 0, done.stderr
    deployment: dict[str, Any] = yaml.safe_load(done.stdout)
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 6
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["restartPolicy"] == "Always"
    assert (
        container["command"][:3] == ["agl", "worker", "my_agent.py:solve"] and "--concurrency=8" in container["command"]
    )
    assert container["env"] == [
        {"name": "AGL_TOKEN", "valueFrom": {"secretKeyRef": {"name": "agl-token", "key": "token"}}}
    ]
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert "secret-x" not in done.stdout  # a token given here never lands in the manifest
    assert "&id" not in done.stdout  # plain YAML, no anchors


def test_a_broken_manifest_fails_the_same_check_and_the_image_is_required() -> None:
    done = manifest("--k8s-manifest", "--k8s-image=img")
    broken = yaml.safe_load(done.stdout)
    broken["spec"]["replicas"] = "six"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    missing = manifest("--k8s-manifest")
    assert missing.returncode == 2 and "--k8s-image" in missing.stderr
