"""`Instrumentor`: the one base under every agl hook into someone else's code (core's HTTP hook, the adapters).

It owns what each hook would otherwise write again: `instrument()` that runs once however often it is called
(thread-safe), `uninstrument()` that undoes exactly what was done and may be called any number of times, a
check that the hooked library can be imported (a clear `MissingDependency` before anything is patched), and
the bookkeeping of every attribute it replaced. A subclass writes only `_instrument()` (patching through
`self.wrap` / `self.replace`) and, for work that is not an attribute (a registered listener or processor),
`_uninstrument()` and `_in_place()`.

Modelled on OpenTelemetry Python contrib's `BaseInstrumentor` (same contract: idempotent instrument /
uninstrument, dependencies declared by the subclass, subclasses write `_instrument` / `_uninstrument`), which
is not used itself because, in opentelemetry-instrumentation 0.66b2 (checked against this repository):
- a repeated `instrument()` logs a WARNING and returns None: the Agents SDK adapter documents `instrument()` as
  cheap to call at the top of every rollout, and CrewAI's returns its listener every time;
- its state is one flag, so a hook that the user removed (the Agents SDK's `set_trace_processors` drops agl's
  processor) still reads as instrumented and cannot be put back by `instrument()`; and there is no lock;
- wrapt's undo (`opentelemetry.instrumentation.utils.unwrap`) sets `__wrapped__` back on the object, which leaves
  a copy in a subclass's `__dict__` when the patched attribute was inherited (AutoGen's `__init_subclass__`,
  `BaseGroupChatManager.on_message_impl`), and it unwraps whatever wrapt proxy is on top, even another's;
- its dependency check reads distribution metadata, not what is imported: `SpecifierSet.contains` rejects
  pre-releases, a framework on `sys.path` without a dist-info counts as missing, and a conflict is only logged;
- it pins `opentelemetry-semantic-conventions==<its own beta>` and adds wrapt to every agl install.
The wrappers stay plain functions with `functools.wraps` (so `__wrapped__` names the original, as before).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

log = logging.getLogger(__name__)

_MISSING: Any = object()
T = TypeVar("T")
_I = TypeVar("_I", bound="Instrumentor")


class MissingDependency(ImportError):
    """`instrument()` was called for a library that cannot be imported; nothing was patched."""


@dataclass(frozen=True)
class Patch:
    """One attribute replaced by `Instrumentor.replace`: enough to put back exactly what was there."""

    owner: Any  # a class or a module
    name: str
    before: Any  # the owner's own attribute before, or _MISSING when it had none (inherited or absent)
    value: Any  # what agl put there

    def undo(self) -> bool:
        """Put `before` back if agl's value is still the owner's own; False (and nothing changed) otherwise."""
        if vars(self.owner).get(self.name, _MISSING) is not self.value:
            return False  # someone replaced agl's value since: taking it out would take theirs out too
        if self.before is _MISSING:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.before)
        return True


class Instrumentor(ABC):
    """Base of agl's hooks. One instance per class (`Cls()` always returns it, so nothing is patched twice),
    like OpenTelemetry's. `__init__` runs again at each `Cls()`: a subclass keeps no state there, only in
    attributes it sets in `_instrument` / `_uninstrument` over class-level defaults."""

    # Import name → what to install, for the message when it is missing (e.g. {"crewai": "agl-crewai"}).
    dependencies: ClassVar[Mapping[str, str]] = {}
    # A framework hook whose work is naming the acting agent (the adapters, agl_otel): while one is in place, a
    # rollout whose every call reached agl without an agent name is a hook that saw no agent, and the worker says so
    names_agents: ClassVar[bool] = False

    _instance: ClassVar[Instrumentor | None] = None
    _lock: threading.RLock
    _patches: list[Patch]
    _instrumented: bool

    def __new__(cls: type[_I]) -> _I:
        # `cls.__dict__`, not `cls._instance`: a subclass of a subclass gets an instance of its own
        instance: _I | None = cls.__dict__.get("_instance")
        if instance is None:
            instance = object.__new__(cls)
            instance._lock = threading.RLock()
            instance._patches = []
            instance._instrumented = False
            cls._instance = instance
            _made.append(instance)
        return instance

    # --- what a subclass writes ---

    @abstractmethod
    def _instrument(self) -> None:
        """Put the hooks in; attributes only through `self.wrap` / `self.replace`, so they are undone for you."""

    def _uninstrument(self) -> None:  # noqa: B027 (optional: most hooks only patch attributes)
        """Undo what `_instrument` did other than through `wrap` / `replace` (called before those are undone)."""

    def _in_place(self) -> bool:
        """Whether the hooks `_instrument` put in are still in effect (override where others can remove them)."""
        return True

    # --- the contract ---

    def instrument(self) -> None:
        """Put the hooks in. Idempotent and thread-safe; hooks removed by someone else since are put back.

        Raises `MissingDependency` (before patching anything) when a library in `dependencies` cannot be imported.
        """
        with self._lock:
            if self._instrumented:
                if self._in_place():
                    return
                self._undo()  # partly removed by someone else: start again from a clean state
            missing = [name for name in self.dependencies if not importable(name)]
            if missing:
                wanted = ", ".join(f"{name} (pip install {self.dependencies[name]})" for name in missing)
                raise MissingDependency(f"{type(self).__name__}.instrument() needs {wanted}: nothing was patched")
            try:
                self._instrument()
            except BaseException:
                self._undo()  # never half instrumented
                raise
            self._instrumented = True

    def uninstrument(self) -> None:
        """Take out every hook `instrument()` put in, restoring the exact originals. Idempotent."""
        with self._lock:
            if self._instrumented:
                self._undo()

    def is_instrumented(self) -> bool:
        with self._lock:
            return self._instrumented and self._in_place()

    def attribution_report(self, spans: Mapping[str, int]) -> str | None:
        """What this hook saw of a rollout whose calls got no agent name, for the worker's warning (`spans`: the
        spans a span-reading hook saw start, by name); None: nothing to add."""
        return None

    # --- patching, with undo ---

    def replace(self, owner: Any, name: str, value: T) -> T:
        """Set `owner.name = value`, remembering what `owner` itself had there (inherited counts as nothing)."""
        with self._lock:
            self._patches.append(Patch(owner, name, vars(owner).get(name, _MISSING), value))
            setattr(owner, name, value)
            return value

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
        """Replace `owner.name` (as looked up, so an inherited one too) by `make(it)`; returns the wrapper."""
        return self.replace(owner, name, make(getattr(owner, name)))

    @property
    def patches(self) -> tuple[Patch, ...]:
        return tuple(self._patches)

    def _undo(self) -> None:
        try:
            self._uninstrument()
        finally:
            while self._patches:
                patch = self._patches.pop()
                if not patch.undo():
                    log.warning(
                        "agl: %s.%s was replaced after %s patched it; leaving the newer one in place",
                        getattr(patch.owner, "__name__", patch.owner),
                        patch.name,
                        type(self).__name__,
                    )
            self._instrumented = False


_made: list[Instrumentor] = []  # every hook's one instance, in the order they were made


def agent_naming_hooks() -> list[Instrumentor]:
    """The hooks in place whose work is naming the acting agent (`names_agents`)."""
    return [i for i in list(_made) if i.names_agents and i.is_instrumented()]


def importable(module: str) -> bool:
    """Whether `import module` would find it (without importing it)."""
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
