"""`agl worker AGENT`: the agent function named by `package.module:function` or `path/to/file.py:function`.

A file inside a package (its folder has an `__init__.py`) is imported under its dotted package name from the
folder above the package's top, so the relative imports of a package-layout project (`from .tools import x`)
work; a file outside any package is imported as a top-level module from its own folder, as `python file.py`
would run it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast


class AgentLoadError(ValueError):
    """The agent spec names nothing callable; the message says what is wrong and how to name it."""


def module_for_file(path: Path) -> tuple[str, Path]:
    """The dotted module name of `path` and the folder that must be on `sys.path` to import it by that name."""
    parts = [path.stem] if path.name != "__init__.py" else []
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    if not parts:
        raise AgentLoadError(f"{path} is a package's __init__.py outside any package folder")
    return ".".join(parts), folder


def load_agent(spec: str) -> Callable[..., Any]:
    """`package.module:function` (importable from here or from the current folder) or `path/file.py:function`."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise AgentLoadError(f"agent {spec!r} must look like 'package.module:function' or 'path/file.py:function'")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        if not path.is_file():
            raise AgentLoadError(f"agent file {path} does not exist")
        module_name, root = module_for_file(path)
    else:
        root = Path(os.getcwd())
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        where = f" (looked from {root})" if exc.name == module_name.split(".")[0] else ""
        raise AgentLoadError(f"cannot import {module_name!r}{where}: {exc}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise AgentLoadError(f"module {module_name!r} ({module.__file__}) has no attribute {attr!r}")
    if not callable(fn):
        raise AgentLoadError(f"{module_name}:{attr} is a {type(fn).__name__}, not a function")
    return cast(Callable[..., Any], fn)
