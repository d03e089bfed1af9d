"""A small container image made from this machine's own files, for the container sandbox's tests (no registry is
reachable here): the system's `python3` with its standard library and the shared libraries it links, and busybox for
a shell and the usual commands. Imported into the runtime under `agl-test-python:latest` once per test session."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

IMAGE = "agl-test-python:latest"
PYTHON = "/usr/bin/python3"
BUSYBOX = "/usr/bin/busybox"
SKIPPED = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "dist-packages", "site-packages"}
APPLETS = ("sh", "cat", "ls", "echo", "sleep", "true", "false", "id", "head", "rm", "mkdir", "touch", "seq")


def build(runtime: Sequence[str]) -> str:
    """Import the image (once: an image already there is kept) and return its name."""
    if subprocess.run([*runtime, "image", "exists", IMAGE], capture_output=True).returncode == 0:
        return IMAGE
    python = os.path.realpath(PYTHON)
    version = Path(python).name  # python3.11
    libraries = _linked(python)
    with tempfile.TemporaryDirectory(prefix="agl-test-image-") as folder:
        root = Path(folder, "root")
        for path in [python, *libraries]:
            _copy(path, root)
        stdlib = Path("/usr/lib") / version
        shutil.copytree(
            stdlib, root / stdlib.relative_to("/"), symlinks=True, ignore=lambda d, names: SKIPPED & set(names)
        )
        (root / "usr/bin").mkdir(parents=True, exist_ok=True)
        os.symlink(Path(python).name, root / "usr/bin/python3")
        (root / "bin").mkdir()
        shutil.copy2(BUSYBOX, root / "bin/busybox")
        for applet in APPLETS:
            os.symlink("busybox", root / "bin" / applet)
        (root / "tmp").mkdir()
        (root / "run").mkdir()
        archive = Path(folder, "image.tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        subprocess.run([*runtime, "import", str(archive), IMAGE], check=True, capture_output=True)
    return IMAGE


def _linked(program: str) -> list[str]:
    found = []
    for line in subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            found.append(path)
    return found


def _copy(path: str, root: Path) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.realpath(path), target)
