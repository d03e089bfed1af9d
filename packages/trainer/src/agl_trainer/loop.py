"""Deprecated alias of `agl_trainer.run.loop`, where agl-trainer's layout by its parts moved this module
(CHANGELOG.md, "Unreleased"): importing it warns, and the alias is removed one release after the move."""

import sys
import warnings

import agl_trainer.run.loop as _moved

warnings.warn(
    "agl_trainer.loop is deprecated: import agl_trainer.run.loop (agl-trainer's layout by its parts moved it; this "
    "alias is removed one release after the move)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved  # one module under both names: the same objects
