"""Keeping the operator token to the processes that hold it: `--token-file`, and no reading of `/proc/<pid>`.

A process of the same user reads another's `/proc/<pid>/environ` (where `AGL_TOKEN` is) and anyone reads its
`/proc/<pid>/cmdline` (where `--token T` is). `agl serve` and `agl worker` therefore mark themselves not dumpable
(`prctl(PR_SET_DUMPABLE, 0)`, Linux): their `/proc` entries then belong to root, no process of their user can read
their environment or memory or attach a debugger, and they leave no core dump. The programs they start are not
affected (the flag is reset at `exec`), and those never get the token (`agl.run_cli` and the sandbox leave it out
of their environment). `--token-file PATH` reads the token from a file, out of every command line.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

log = logging.getLogger(__name__)

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def forbid_dumping() -> bool:
    """Mark this process not dumpable (Linux; see the module's docstring). False where it could not be done."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as exc:
        log.warning("could not keep this process's /proc entries from other processes of its user: %s", exc)
        return False
    return True


def is_dumpable() -> bool | None:
    """This process's dumpable flag (`prctl(PR_GET_DUMPABLE)`); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))


def read_token_file(path: Path) -> str:
    """The token a file holds (its first line, without surrounding white space)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint="--token-file") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise click.BadParameter(f"{path} holds no token", param_hint="--token-file")
    return token


def token_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--token` and `--token-file` for a command that takes `token`: the command gets the token either gives."""

    @functools.wraps(command)
    def with_token(*args: Any, token: str | None = None, token_file: Path | None = None, **kwargs: Any) -> Any:
        if token_file is not None:
            source = click.get_current_context().get_parameter_source("token")
            if token is not None and source is click.core.ParameterSource.COMMANDLINE:
                raise click.UsageError("give the token once: --token or --token-file, not both")
            token = read_token_file(token_file)
        return command(*args, token=token, **kwargs)

    with_token = click.option(
        "--token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Read the bearer token from this file (its first line): unlike --token, it appears in no command line.",
    )(with_token)
    return click.option(
        "--token",
        envvar="AGL_TOKEN",
        default=None,
        help="Bearer token of the server (env AGL_TOKEN). On the command line it is visible to every local process"
        " (/proc/<pid>/cmdline, ps): prefer AGL_TOKEN or --token-file.",
    )(with_token)
