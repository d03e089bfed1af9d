"""Reading what an agent left, without following it out: `read_agent_file`.

After a sandboxed command ends, its workspace and home are read by the worker, which sees everything its user sees.
A link the agent planted there (`trajectory.json -> ~/.ssh/id_rsa`, `python_programs -> /`) would make an evaluator
read, score or store a file the agent could never reach. So a file in an agent's folders is opened with no symbolic
link anywhere on its path below the rollout's folder (`agl.workspace`'s, or the one the caller names), and only if it
is a regular file. No process of the sandbox is left to swap a path in between: the sandbox is gone when this runs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MARKER = ".agl-rollout"  # in the folder `agl.workspace` makes: the workspace and the home are below it


def read_agent_file(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None, max_bytes: int = 64 * 2**20
) -> bytes:
    """The bytes of the regular file `path` (at most `max_bytes`), refusing (ValueError) a symbolic link at it or on
    any folder between it and `root` (default: the `agl.workspace` folder it is in, else its own folder)."""
    target = Path(os.path.abspath(path))
    top = Path(os.path.abspath(root)) if root is not None else _rollout_root(target)
    if top not in target.parents:
        raise ValueError(f"{target} is not inside {top}")
    relative = target.relative_to(top).parts
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in relative[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise ValueError(f"{target}: {part} is not a folder (a link is not followed): {exc.strerror}") from None
            os.close(fd)
            fd = inner
        try:
            file_fd = os.open(relative[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            raise ValueError(
                f"{target} cannot be read as the agent's file (a link is not followed): {exc.strerror}"
            ) from None
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{target} is not a regular file")
        return f.read(max_bytes)


def _rollout_root(target: Path) -> Path:
    for folder in target.parents:
        if (folder / MARKER).is_file():
            return folder
    return target.parent
