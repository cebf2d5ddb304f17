"""Replaying a datacenter's workload against policies, in process, on a simulated clock, with the
same placement function the selector runs (vmsched.scheduling.placement.place)."""
