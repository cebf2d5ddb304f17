"""The replay rule (vmsched.lifecycle.replay), pure: a request id already decided gets its stored
decision when it is the same request, is refused when it is a different one, and a stored decision
is owed its event only by the same request, only while its event is unconfirmed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from tests.factories import vm
from vmsched.contracts import DecisionStatus, Explanation, ScheduleDecision, ScheduleRequest
from vmsched.errors import InvalidRequest
from vmsched.lifecycle.replay import event_of, owes_event, same_request
from vmsched.store.decisions import StoredDecision, request_fingerprint

RID = uuid.uuid4()
REQ = ScheduleRequest(request_id=RID, cluster_id="c1", vm=vm(vm_id="vm-1"))
DECISION = ScheduleDecision(
    request_id=RID,
    cluster_id="c1",
    vm_id="vm-1",
    status=DecisionStatus.UNPLACEABLE,
    explanation=Explanation(summary="0/1 hosts available", candidates=1),
    decided_at=datetime.now(UTC),
)
FP = request_fingerprint(REQ)


def stored(fingerprint: str | None = FP, published: bool = False) -> StoredDecision:
    return StoredDecision(DECISION, fingerprint, published)


def test_the_same_request_gets_the_stored_decision() -> None:
    assert same_request(REQ, stored(), FP) == DECISION
    # A new deadline is the same request (a client resending it may set one).
    resent = REQ.model_copy(update={"deadline": datetime(2100, 1, 1, tzinfo=UTC)})
    assert same_request(resent, stored(), request_fingerprint(resent)) == DECISION


def test_a_different_request_under_the_same_id_is_refused() -> None:
    other = REQ.model_copy(update={"vm": vm(vm_id="vm-2")})
    with pytest.raises(InvalidRequest, match="already used for a different request") as err:
        same_request(other, stored(), request_fingerprint(other))
    assert err.value.location == "request_id"


def test_a_record_without_a_fingerprint_matches_any_request() -> None:
    assert same_request(REQ, stored(fingerprint=None), "anything") == DECISION


def test_an_event_is_owed_only_by_the_same_request_while_unconfirmed() -> None:
    assert owes_event(stored(), FP)
    assert not owes_event(stored(published=True), FP)
    assert not owes_event(stored(), "another request")


def test_a_commit_publishes_what_it_stored_or_an_owed_event() -> None:
    assert event_of(True, stored(), FP) == DECISION
    assert event_of(False, stored(), FP) == DECISION  # stored before, its event never confirmed
    assert event_of(False, stored(published=True), FP) is None
    assert event_of(False, stored(), "another request") is None
