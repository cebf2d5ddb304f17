"""ha-monitor: HA reservation alerts per cluster (oVirt's HA VM reservation)."""
