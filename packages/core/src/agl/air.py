"""Deprecated alias of `agl.learn.air`, where agl-core's layout by stage moved this module (CHANGELOG.md, "Unreleased"):
importing it warns, and the alias is removed one release after the move."""

import sys
import warnings

import agl.learn.air as _moved

warnings.warn(
    "agl.air is deprecated: import agl.learn.air (agl-core's layout by stage moved it; this alias is removed one "
    "release after the move)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved  # one module under both names: the same objects, registries included
