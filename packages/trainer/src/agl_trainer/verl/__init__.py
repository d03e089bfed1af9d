"""verl as agl's policy backend (`agl train --trainer verl`): the update runs in verl's PPO actor worker on Ray.

- `backend.VerlPolicy`: the `PolicyBackend` (log-probs, update, save/load) plus the hand-over of the trained
  weights to the inference side (`save_adapter`, `state_dict_for_engine`, `load_into`).
- `batch`: transitions → verl's batch layout; `loss`: agl's loss in verl's terms (the mapping, term by term);
  `worker`: verl's actor worker with the few lines the CPU needs; `platform`: verl's platform for the CPU.

Nothing here imports verl until a `VerlPolicy` is made: `require_verl()` first says clearly what is missing.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import Version

SUPPORTED = ">=0.9.1,<0.10"  # tested with 0.9.1: the per-sequence temperature and the engine workers are 0.9's
INSTALL_HINT = 'pip install "agl-trainer[verl]"'
PLATFORM_NAME = "agl-cpu"  # verl's name of agl's CPU platform (agl_trainer.verl.platform)


class VerlUnavailable(RuntimeError):
    """verl (or Ray) is missing or of a version agl does not support; the message says what to install."""


def verl_version() -> str | None:
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


def check_version(found: str) -> None:
    """`VerlUnavailable` unless agl supports verl `found`."""
    if not (Version("0.9.1") <= Version(found) < Version("0.10")):
        raise VerlUnavailable(
            f"agl train --trainer verl supports verl {SUPPORTED}, found verl {found}: run {INSTALL_HINT} "
            "(agl drives verl's actor worker directly, whose interface changes between verl's minor versions)"
        )


def require_verl() -> str:
    """The installed verl's version, if agl supports it; otherwise `VerlUnavailable` saying what to do. Reads the
    installed distributions only: verl itself is not imported."""
    found = verl_version()
    if found is None:
        raise VerlUnavailable(
            f"agl train --trainer verl needs verl {SUPPORTED} and Ray: verl is not installed. Run {INSTALL_HINT} "
            "in an environment of its own (verl pins transformers below 5.11)"
        )
    check_version(found)
    try:
        metadata.version("ray")
    except metadata.PackageNotFoundError:
        raise VerlUnavailable(f"verl {found} is installed but Ray is not: run {INSTALL_HINT}") from None
    return found


def import_verl() -> str:
    """`require_verl`, then verl and Ray imported: an installation that does not import (a transformers outside
    verl's pin, say) is a `VerlUnavailable` that names the cause, not a stack trace from inside verl."""
    found = require_verl()
    try:
        import ray  # noqa: F401
        import verl  # noqa: F401
    except Exception as exc:
        raise VerlUnavailable(
            f"verl {found} is installed but does not import ({type(exc).__name__}: {exc}). Run {INSTALL_HINT} in an "
            "environment of its own: verl pins its own transformers"
        ) from exc
    return found


__all__ = [
    "INSTALL_HINT",
    "PLATFORM_NAME",
    "SUPPORTED",
    "VerlUnavailable",
    "check_version",
    "import_verl",
    "require_verl",
    "verl_version",
]
