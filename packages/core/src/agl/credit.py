"""Deprecated alias of `agl.learn.credit`, where agl-core's layout by stage moved this module (CHANGELOG.md, "Unreleased"):
importing it warns, and the alias is removed one release after the move."""

import sys
import warnings

import agl.learn.credit as _moved

warnings.warn(
    "agl.credit is deprecated: import agl.learn.credit (agl-core's layout by stage moved it; this alias is removed one "
    "release after the move)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved  # one module under both names: the same objects, registries included
