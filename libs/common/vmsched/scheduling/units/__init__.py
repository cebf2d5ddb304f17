"""Policy units: pure filters and weight functions over a HostTable. See base.py for the rules,
plugins.py for units from other packages."""

from vmsched.scheduling.units.base import (
    BUILTIN_ORIGIN,
    Direction,
    FilterVerdict,
    PolicyUnit,
    PropertySpec,
    Props,
    validate_properties,
)
from vmsched.scheduling.units.plugins import RefusedPlugin
from vmsched.scheduling.units.registry import BUILTIN_UNITS, REGISTRY, UnitRegistry, get_unit

__all__ = [
    "BUILTIN_ORIGIN",
    "BUILTIN_UNITS",
    "REGISTRY",
    "Direction",
    "FilterVerdict",
    "PolicyUnit",
    "PropertySpec",
    "Props",
    "RefusedPlugin",
    "UnitRegistry",
    "get_unit",
    "validate_properties",
]
