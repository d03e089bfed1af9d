"""Which launcher a sandbox's kind uses: bubblewrap's (`launch.Launch`) or a container's
(`container.ContainerLaunch`). Above both, so that neither imports the other back."""

from __future__ import annotations

from agl.capture.sandbox.container import ContainerLaunch
from agl.capture.sandbox.launch import Launch
from agl.capture.sandbox.policy import Sandbox


def launch_class(sandbox: Sandbox) -> type[Launch]:
    """bubblewrap's `Launch`, or the container's for `kind="container"`."""
    return ContainerLaunch if sandbox.kind == "container" else Launch
