"""`vmsched simulate --over-bus` without servers: the policy copy a replay stores, how two replays'
decisions are compared and said, and a broker that is down said in a sentence."""

from __future__ import annotations

import uuid

import pytest

from vmsched.contracts import FilterEntry, PolicyDocument, RequestKind, WeightEntry
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.scheduling.policy_docs import policy_of, problems
from vmsched.scheduling.units import REGISTRY
from vmsched.settings import Settings
from vmsched_services.tools import cli
from vmsched_services.tools.simulate_bus import Decided, differences, needed_services, stored_policy

NOWHERE = "127.0.0.1:1"  # nothing listens: the connection is refused at once


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_the_stored_copy_places_as_the_policy_and_has_no_balance_unit(name: str) -> None:
    policy = BUILTIN_POLICIES[name]
    doc = stored_policy(policy, f"simulate-0123456789ab-{name}")
    assert doc.name == f"simulate-0123456789ab-{name}"
    assert doc.balance is None  # no balancer service balances the replay's cluster on its own
    assert [f.unit for f in doc.filters] == policy.filter_names()
    assert [(w.unit, w.factor) for w in doc.weights] == [(w.unit, w.factor) for w in policy.weights]
    assert doc.selector == policy.selector
    # Every property the filters and weights read is kept; policy-admin accepts the copy.
    assert doc.properties.items() <= policy.properties.items()
    assert problems(doc, REGISTRY) == []


def test_properties_only_the_balance_unit_reads_are_left_out_of_the_copy() -> None:
    # policy-admin refuses a property no unit of the policy reads; without the balance unit, these
    # are such properties (they change nothing the selector decides).
    doc = PolicyDocument(
        name="mine",
        filters=[FilterEntry(unit="Memory"), FilterEntry(unit="CPUOverloaded")],
        weights=[WeightEntry(unit="OptimalForEvenMemoryDistribution", factor=1)],
        balance="OptimalForEvenGuestDistribution",
        properties={"HighUtilization": "85", "HighVmCount": "7", "MigrationThreshold": "3"},
    )
    assert problems(doc, REGISTRY) == []
    copy = stored_policy(policy_of(doc, uuid.uuid4()), "simulate-0123456789ab-mine")
    assert copy.properties == {"HighUtilization": "85"}
    assert problems(copy, REGISTRY) == []


def at(n: float, vm: str, host: str | None, kind: RequestKind = RequestKind.RUN) -> Decided:
    return Decided(n, kind, vm, host)


def test_differences_are_listed_position_by_position_and_said_plainly() -> None:
    local = [at(0, "a", "h1"), at(60, "b", None), at(120, "b", "h2", RequestKind.MIGRATE)]
    bus = [at(0, "a", "h1"), at(60, "b", "h3")]
    diffs = differences(local, bus)
    assert [d.index for d in diffs] == [1, 2]
    assert [d.text() for d in diffs] == [
        "arrival of b at 60 s: h3 over the bus, not placed in process",
        "migration of b at 120 s: no such decision over the bus, h2 in process",
    ]
    assert differences(local, local) == []
    # Once the two have gone different ways, a decision may be about another VM: it is named.
    [shifted] = differences([at(5, "x", "h1")], [at(5, "y", "h1")])
    assert shifted.text() == "arrival of y at 5 s: h1 over the bus, [arrival of x at 5 s] in process"


def test_the_services_a_replay_needs() -> None:
    assert needed_services(Settings()) == ["state-tracker", "filter-worker", "selector", "policy-admin"]
    weighing = Settings(place_in_worker=False)
    assert needed_services(weighing) == ["state-tracker", "weigher", "filter-worker", "selector", "policy-admin"]


def test_a_broker_that_is_down_is_said_in_a_sentence(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMSCHED_AMQP_URL", f"amqp://guest:secret@{NOWHERE}/")
    code = cli.main(["simulate", "--hosts", "3", "--vms", "5", "--hours", "1", "--over-bus"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    assert err.startswith(f"vmsched: bus_unavailable: nothing listens at {NOWHERE} (connection refused)")
    assert f"amqp://guest:***@{NOWHERE}/" in err
    assert "Traceback" not in err
    assert "secret" not in err
