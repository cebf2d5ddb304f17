"""An example vmsched plugin: RackLabelFilter and RackSpreadWeight (see racks.py).

`UNITS` is what the package's entry point in the group "vmsched.units" names (pyproject.toml).
"""

from vmsched_example_units.racks import (
    ALLOWED_RACKS_SPEC,
    RACK_LABEL_FILTER,
    RACK_SPREAD_WEIGHT,
    allowed_racks,
    rack_label_filter,
    rack_spread_weight,
)

UNITS = (RACK_LABEL_FILTER, RACK_SPREAD_WEIGHT)

__all__ = [
    "ALLOWED_RACKS_SPEC",
    "RACK_LABEL_FILTER",
    "RACK_SPREAD_WEIGHT",
    "UNITS",
    "allowed_racks",
    "rack_label_filter",
    "rack_spread_weight",
]
