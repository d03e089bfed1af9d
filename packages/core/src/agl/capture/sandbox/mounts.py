"""What a sandbox sees of the machine: the system read-only, a few files of `/etc`, the command's own program files,
and what the task names. Nothing else exists inside: not the user's home, not the run folder, not the store, not
other rollouts' workspaces.

`/etc` is read entry by entry from a list of what programs need to start (the dynamic linker's cache, TLS roots,
name-service switches, time zones, interpreters' site files): binding all of it would show `shadow`, SSH host keys,
`pip.conf` or `npmrc` with an index's credentials. `passwd` and `group` are the sandbox's own, naming its one user.

The program files: the command's executable, its interpreter (from the `#!` line, `env` resolved), and the
installation either belongs to, found by walking up from the file: a Python virtual environment (the folder with
`pyvenv.cfg`, and the Python it was made from), a `node_modules` folder, or an installation prefix (`PREFIX/bin/x`
with `PREFIX/lib`). A script given to an interpreter (`python script.py`, `node cli.js`) is visible as the one file.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "crypto-policies", "debian_version",
    "environment", "gai.conf", "gitconfig", "host.conf", "inputrc", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "locale.alias", "locale.conf", "localtime", "lsb-release", "magic", "magic.mime", "mime.types",
    "nsswitch.conf", "os-release", "pki", "profile", "protocols", "python3", "services", "shells", "ssl", "terminfo",
    "timezone", "vim", "xattr.conf",
)  # fmt: skip
INTERPRETERS = ("python", "node", "bun", "deno", "bash", "sh", "dash", "perl", "ruby")
SANDBOX_USER = "agent"
SANDBOX_UID = 1000


def etc_entries() -> list[str]:
    """The `/etc` entries a sandbox gets, those this machine has (the running Python's own version folder too)."""
    names = [*ETC, *(n for n in _listdir("/etc") if n.startswith("python3."))]
    return [f"/etc/{n}" for n in dict.fromkeys(names) if os.path.lexists(f"/etc/{n}")]


_etc_lock = threading.Lock()
_etc_copy: str | None = None


def etc_folder() -> str:
    """The sandbox's `/etc`: a copy of `etc_entries()`, made once per process (one bind instead of one per entry:
    each costs bwrap two mount calls, ~10 ms a sandbox in all). Only what every user may read is copied (not
    `ssl/private`); links are kept as links. `passwd`, `group` and `hosts` are empty here: each sandbox binds its own."""
    global _etc_copy
    with _etc_lock:
        if _etc_copy is None or not os.path.isdir(_etc_copy):
            folder = tempfile.mkdtemp(prefix="agl-sandbox-etc-")
            atexit.register(shutil.rmtree, folder, True)
            for entry in etc_entries():
                _copy_readable(entry, os.path.join(folder, os.path.basename(entry)))
            for name in ("passwd", "group", "hosts"):
                Path(folder, name).touch()
            os.chmod(folder, 0o755)
            _etc_copy = folder
        return _etc_copy


def _copy_readable(source: str, target: str) -> None:
    info = os.lstat(source)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(source), target)
    elif not info.st_mode & stat.S_IROTH:
        return  # a key or a credential readable by its owner alone
    elif stat.S_ISDIR(info.st_mode):
        os.mkdir(target)
        for name in _listdir(source):
            _copy_readable(os.path.join(source, name), os.path.join(target, name))
        os.chmod(target, stat.S_IMODE(info.st_mode))
    elif stat.S_ISREG(info.st_mode):
        shutil.copy2(source, target)


def passwd_file(home: str) -> str:
    return (
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:agl sandbox:{home}:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
    )


def hosts_file(names: Sequence[str]) -> str:
    """The sandbox's /etc/hosts: loopback, and agl's server by its name (its relay listens on loopback inside)."""
    extra = " ".join(n for n in dict.fromkeys(names) if n and n not in ("localhost", "127.0.0.1"))
    return f"127.0.0.1 localhost agl-sandbox {extra}".rstrip() + "\n::1 localhost ip6-localhost\n"


def group_file() -> str:
    return f"{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n"


def program_paths(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The files and folders `argv` needs to run, outside the system folders, to be shown read-only."""
    found: dict[str, None] = {}
    program = resolve_program(argv[0], env)
    if program is None:
        return []
    _add_program(program, env, found, depth=0)
    if Path(program).name.startswith(INTERPRETERS):
        script = next((a for a in argv[1:] if not a.startswith("-")), None)
        if script is not None and os.path.isfile(script) and not (len(argv) > 2 and argv[1] in ("-c", "-m", "-e")):
            found[os.path.abspath(script)] = None
    return [p for p in found if not is_system(p)]


def outermost(paths: Sequence[str]) -> list[str]:
    """`paths` without those inside another of them (a bind of a folder already shows what is in it)."""
    kept: list[str] = []
    for path in sorted(dict.fromkeys(os.path.normpath(p) for p in paths)):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def resolve_program(name: str, env: Mapping[str, str]) -> str | None:
    """Where `name` is, as the sandbox's PATH finds it. Version managers' shims (pyenv, rbenv, asdf: scripts that
    run the manager to pick a version) are passed over: the manager is not in the sandbox."""
    if os.sep in name:
        return os.path.abspath(name) if os.path.exists(name) else None
    folders = [f for f in env.get("PATH", os.defpath).split(os.pathsep) if f and Path(f).name != "shims"]
    return shutil.which(name, path=os.pathsep.join(folders))


def inside_path(path: str, visible: Sequence[str]) -> str:
    """The worker's PATH less the folders the sandbox does not show (and shims: see `resolve_program`)."""
    roots = [*SYSTEM, *visible]
    kept = [
        f
        for f in path.split(os.pathsep)
        if f and Path(f).name != "shims" and any(f == r or f.startswith(r.rstrip("/") + "/") for r in roots)
    ]
    return os.pathsep.join(dict.fromkeys(kept)) or os.defpath


def is_system(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in SYSTEM)


def _add_program(path: str, env: Mapping[str, str], found: dict[str, None], depth: int) -> None:
    for candidate in dict.fromkeys([os.path.abspath(path), os.path.realpath(path)]):
        found[installation(candidate) or candidate] = None
        found[candidate] = None
    interpreter = _shebang(os.path.realpath(path))
    if interpreter is not None and depth < 4:
        program: str | None = interpreter[0]
        if os.path.basename(interpreter[0]) == "env" and len(interpreter) > 1:  # `#!/usr/bin/env node`
            name = next((a for a in interpreter[1:] if not a.startswith("-") and "=" not in a), None)
            program = resolve_program(name, env) if name else None
        if program is not None and os.path.exists(program):
            _add_program(program, env, found, depth + 1)
    venv = _venv_root(path)
    if venv is not None:
        base = _venv_base_prefix(venv)
        if base is not None:
            found[base] = None


def installation(path: str) -> str | None:
    """The folder the program at `path` was installed in as a whole: a virtual environment, a `node_modules`, a
    `PREFIX` with `bin/` and `lib/`; None for a file on its own."""
    venv = _venv_root(path)
    if venv is not None:
        return venv
    parts = Path(path).parts
    if "node_modules" in parts:
        return str(Path(*parts[: len(parts) - parts[::-1].index("node_modules")]))
    parent = Path(path).parent
    if parent.name == "bin" and (parent.parent / "lib").is_dir() and str(parent.parent) != "/":
        return str(parent.parent)
    return None


def _venv_root(path: str) -> str | None:
    for folder in Path(path).parents:
        if (folder / "pyvenv.cfg").is_file():
            return str(folder)
    return None


def _venv_base_prefix(venv: str) -> str | None:
    """The installation the virtual environment was made from (`home = PREFIX/bin` in its `pyvenv.cfg`)."""
    try:
        lines = Path(venv, "pyvenv.cfg").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            home = Path(os.path.realpath(value.strip()))
            return str(home.parent if home.name == "bin" else home)
    return None


def python_prefix(executable: str) -> str:
    """The installation an interpreter's standard library is in (for the sandbox's own first process)."""
    real = Path(os.path.realpath(executable))
    return str(real.parent.parent if real.parent.name == "bin" else real.parent)


def _shebang(path: str) -> list[str] | None:
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()
    return line.split() or None


def _listdir(path: str) -> Iterable[str]:
    try:
        return os.listdir(path)
    except OSError:
        return ()
