"""Deprecated alias of `agl.common.trainable`, where agl-core's layout by stage moved this module (CHANGELOG.md, "Unreleased"):
importing it warns, and the alias is removed one release after the move."""

import sys
import warnings

import agl.common.trainable as _moved

warnings.warn(
    "agl.trainable is deprecated: import agl.common.trainable (agl-core's layout by stage moved it; this alias is removed one "
    "release after the move)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved  # one module under both names: the same objects, registries included
