"""The replay rule (pure, no I/O): what a request whose id already has a stored decision gets.

* The same request again (same fingerprint; a new deadline does not count, see
  store.decisions.request_fingerprint) gets the stored decision, whoever stored it and when: before
  it arrived, or while it waited for the cluster's lock (decided meanwhile).
* The same id with a different request (another cluster, VM, batch, ...) is refused with
  InvalidRequest: answering with another request's decision would be wrong.
* Exactly one event per stored decision: a stored decision of this same request whose event is not
  marked published is owed its event by whoever finds it holding the cluster's lock (its storer
  died between storing and publishing). A record of a different request is never published for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from vmsched.contracts import ScheduleDecision, ScheduleRequest
from vmsched.errors import InvalidRequest
from vmsched.logging import get_logger
from vmsched.store.decisions import StoredDecision

# Under the selector's name: the selector is the service whose work these lines report.
log = get_logger("vmsched.selector")


@dataclass(frozen=True)
class Stored:
    """A stored decision whose event is settled; `ours` if this handling of the request stored it."""

    record: StoredDecision
    ours: bool


def same_request(req: ScheduleRequest, found: StoredDecision, fingerprint: str) -> ScheduleDecision:
    """The stored decision, if it was made for this same request; InvalidRequest if the request id
    was used for a different one."""
    if not found.matches(fingerprint):
        d = found.decision
        log.warning("request id reused for a different request", first_cluster=d.cluster_id, first_vm=d.vm_id)
        raise InvalidRequest(
            f"request id {req.request_id} was already used for a different request "
            f"(cluster {d.cluster_id}, vm {d.vm_id}); send a new request id",
            location="request_id",
        )
    return found.decision


def owes_event(found: StoredDecision, fingerprint: str) -> bool:
    """Whether the holder of the cluster's lock that finds `found` for a request with `fingerprint`
    must publish its event: it is this request's and its event is not confirmed."""
    return found.matches(fingerprint) and not found.published


def event_of(created: bool, found: StoredDecision, fingerprint: str) -> ScheduleDecision | None:
    """The event a commit publishes for one of its decisions: the one it stored (`created`), or the
    one stored before for the same request whose event was never confirmed; None otherwise."""
    return found.decision if created or owes_event(found, fingerprint) else None


__all__ = ["Stored", "event_of", "owes_event", "same_request"]
