"""`vmsched bench`: what a decision costs, at 100 and 1,000 hosts per cluster.

Three measurements per cluster size, written as JSON (bench-results/bench.json by default):

* in_process: the same pipeline (candidates, filter chain, weights, RankSelector, summary) called
  directly on a HostTable: the floor any deployment pays.
* bus: full decisions through RabbitMQ with every service in its own process, as deployed
  (state-tracker, filter-worker, weigher, selector), Redis lock + pending + idempotency, and the
  engine reporting each placed VM running (so caches really move). Once one request at a time
  (latency), once `--concurrency` at a time (throughput), and with `--clusters N` that many at a
  time spread over N clusters; after a warm-up that touches every cluster (steady state). Each run
  also says how much CPU every process spent per decision: the services, the bench itself (the
  engine) and RabbitMQ and Redis when they run on this machine.
* costs: one RPC round trip with an empty handler (the price of a bus hop), and encode + decode
  of every message on the hot path at that size (the price of serialization).
* balance_pass: one balancer pass per balance unit (table building + the unit), in process, on a
  cluster of 10x the largest `--hosts` size (10,000 hosts by default, and at most) with 20 VMs per
  host.

It is a benchmark, not a test: numbers depend on the machine; nothing asserts on them.

`--suite` runs the workload table instead (bench.suite: basic, spread, churn, unschedulable,
sequential, big, burst; scheduler_perf's shape).

The package, one module per job: data (the hosts, VMs and policies measured), timing (latency
statistics, timed runs, CPU per process), in_process, codec, ha, balance, floors (a bus hop and a
Redis lock) and bus (the measurements), stack (the policies and clusters the services are given),
report (the figures as text), suite (the workload table) and run (all of it, into the JSON).
"""

from __future__ import annotations

from vmsched_services.tools.bench.run import main, run_bench

__all__ = ["main", "run_bench"]
