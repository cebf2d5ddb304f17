"""Every policy unit by name: the ones vmsched ships, then the plugins' (vmsched.scheduling.units.plugins).

A registry is an object its caller builds and holds (`UnitRegistry(BUILTIN_UNITS)`); the functions
that look units up take one (`get_unit(name, registry)`, the pipeline's `units=`). `REGISTRY` is the
process's own, the one documented owner of the installed plugins: the runner loads it with the
service's settings, the CLI lists it, and code not handed another registry reads it. Tests that
install or change plugins build their own, or `reset()` it.

A registry is built on first use, not when made: loading plugins imports other packages and logs
what it refuses, which a service wants after its logging is configured (the runner calls
`REGISTRY.load(settings)` right after, before any service starts), and `vmsched --help` does not
want at all. Built once; what it holds never changes after that, until `reset`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from vmsched.constants import UNIT_ENTRY_POINT_GROUP
from vmsched.errors import UnknownPolicyUnit
from vmsched.logging import get_logger
from vmsched.scheduling.units.affinity import AFFINITY_UNITS
from vmsched.scheduling.units.balance_spread import SPREAD_UNITS
from vmsched.scheduling.units.base import PolicyUnit
from vmsched.scheduling.units.filters import FILTER_UNITS
from vmsched.scheduling.units.nova_filters import NOVA_FILTER_UNITS
from vmsched.scheduling.units.nova_weights import NOVA_WEIGHT_UNITS
from vmsched.scheduling.units.plugins import (
    UNKNOWN_ORIGIN,
    CallLimit,
    EntryPoints,
    RefusedPlugin,
    discover,
    load_plugins,
)
from vmsched.scheduling.units.weights import WEIGHT_UNITS
from vmsched.scheduling.units.weights_packing import PACKING_UNITS

if TYPE_CHECKING:
    from vmsched.settings import Settings

log = get_logger("vmsched.units.registry")

#: The units vmsched ships, in catalogue order.
BUILTIN_UNITS: tuple[PolicyUnit, ...] = (
    *FILTER_UNITS,
    *WEIGHT_UNITS,
    *SPREAD_UNITS,
    *AFFINITY_UNITS,
    *NOVA_FILTER_UNITS,
    *NOVA_WEIGHT_UNITS,
    *PACKING_UNITS,
)

#: The plugin call limit until a service sets its own (Settings.plugin_call_limit_s's default).
DEFAULT_CALL_LIMIT_S = 0.5


class UnitRegistry(Mapping[str, PolicyUnit]):
    """The built-in units, then the accepted plugin units; and the plugins refused, with reasons.

    `entry_points` is the seam tests use to load hand-made entry points instead of the installed ones.
    """

    def __init__(
        self,
        builtins: Iterable[PolicyUnit],
        *,
        entry_points: EntryPoints = discover,
        call_limit_s: float = DEFAULT_CALL_LIMIT_S,
    ) -> None:
        self.builtins: tuple[PolicyUnit, ...] = tuple(builtins)
        names = [u.name for u in self.builtins]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two policy units named {', '.join(twice)}")
        self._entry_points = entry_points
        self._limit = CallLimit(call_limit_s)
        self._units: Mapping[str, PolicyUnit] | None = None
        self._refused: tuple[RefusedPlugin, ...] = ()
        #: False under VMSCHED_PLUGINS=false (`load` with such settings): the built-ins only.
        self._plugins_on = True
        # Reentrant, so that a plugin using the registry while it is imported is refused (below)
        # instead of deadlocking the process.
        self._lock = threading.RLock()
        self._building = False

    def load(self, settings: Settings | None = None) -> UnitRegistry:
        """Build now, if not built yet; with `settings`, bound plugin calls by its plugin_call_limit_s."""
        if settings is not None:
            self._limit.seconds = settings.plugin_call_limit_s
            with self._lock:
                # Decided before the first build only: a registry in use does not lose its units.
                if self._units is None:
                    self._plugins_on = settings.plugins
        self._built()
        return self

    def reset(self) -> None:
        """Forget the loaded plugins (and refusals): the next use loads the entry points again."""
        with self._lock:
            self._units = None
            self._refused = ()
            self._plugins_on = True

    @property
    def call_limit_s(self) -> float:
        return self._limit.seconds

    @property
    def refused(self) -> tuple[RefusedPlugin, ...]:
        """The plugin entry points and units not loaded, each with its package and reason."""
        self._built()
        return self._refused

    @property
    def plugins(self) -> tuple[PolicyUnit, ...]:
        """The accepted plugin units."""
        return tuple(self._built().values())[len(self.builtins) :]

    def origin(self, name: str) -> str:
        """Where a unit comes from: "builtin" or "<distribution> <version>"."""
        return get_unit(name, self).origin

    def _built(self) -> Mapping[str, PolicyUnit]:
        units = self._units
        if units is not None:
            return units
        with self._lock:
            if self._units is None:
                if self._building:
                    raise RuntimeError("the unit registry is being built: a plugin must not use it while it loads")
                self._building = True
                try:
                    self._units = self._build()
                finally:
                    self._building = False
            return self._units

    def _build(self) -> Mapping[str, PolicyUnit]:
        units = {u.name: u for u in self.builtins}
        try:
            found = list(self._entry_points()) if self._plugins_on else []
        except Exception as exc:  # unreadable package metadata: run with the built-ins
            found = []
            unread = RefusedPlugin(UNKNOWN_ORIGIN, UNIT_ENTRY_POINT_GROUP, f"the entry points could not be read: {exc}")
            log.warning("plugins refused", package=unread.package, entry_point=unread.entry_point, reason=unread.reason)
            self._refused = (unread,)
        loaded = load_plugins(found, units.keys(), self._limit)
        self._refused = (*self._refused, *loaded.refused)
        units.update((u.name, u) for u in loaded.units)
        return MappingProxyType(units)

    def __getitem__(self, name: str) -> PolicyUnit:
        units = self._units
        return (units if units is not None else self._built())[name]

    def __contains__(self, name: object) -> bool:
        units = self._units
        return name in (units if units is not None else self._built())

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())

    def __repr__(self) -> str:
        state = "not built" if self._units is None else f"{len(self._units)} units, {len(self._refused)} refused"
        return f"UnitRegistry({state})"


#: The process's registry: the built-in units and the installed plugins (see the module doc).
REGISTRY = UnitRegistry(BUILTIN_UNITS)


def get_unit(name: str, registry: Mapping[str, PolicyUnit] = REGISTRY) -> PolicyUnit:
    """The unit called `name` in `registry` (the process's when not given); UnknownPolicyUnit if none."""
    try:
        return registry[name]
    except KeyError:
        raise UnknownPolicyUnit(f"unknown policy unit {name!r}", location="unit") from None


__all__ = ["BUILTIN_UNITS", "REGISTRY", "UnitRegistry", "get_unit"]
