"""Private server instances on loopback ports, started and stopped by the fault suite and the tests
that stop, restart, fail over or cluster a server (never the shared servers a run is given).

Each kind lives in its own module (redis, rabbit, postgres) and builds on `base.PrivateServer`.
"""
