"""What operators and developers run around the services: the `vmsched` command and what it drives.

`cli` is the command (`vmsched run|up|schedule|demo|bench|chaos|db|contracts ...`); `demo` runs the simulated
datacenter, `bench` measures decisions, `chaos` is the fault suite, and `procs` starts, freezes and kills service
processes for the end-to-end tests, the bench and the fault suite. These modules sit above the services and
the library: they import both, nothing imports them.
"""
