"""Catalogue hashes and the route a policy's worker calls take (vmsched.lifecycle.routes), the
catalogue routes' names (constants), what policy-admin makes of instances lacking units, and a worker
refusing a request naming a unit it lacks."""

from __future__ import annotations

import re

import pytest

from vmsched import constants as c
from vmsched.contracts import PolicyDocument
from vmsched.errors import UnitsUnavailable
from vmsched.lifecycle.routes import choose_route
from vmsched.scheduling.units import REGISTRY
from vmsched.settings import Settings
from vmsched.store.catalogues import Announcement, catalogue_hash
from vmsched_services.policy_admin.availability import routed_check, running_instances, strict_available
from vmsched_services.tools.security.rabbit_defs import grants
from vmsched_services.worker_units import check_units

BUILTINS = {"Memory": "builtin", "CPU": "builtin", "RAMWeigher": "builtin"}
PLUGIN = {
    **BUILTINS,
    "RackLabelFilter": "vmsched-example-units 0.1.0",
    "RackSpreadWeight": "vmsched-example-units 0.1.0",
}


def instance(service: str, name: str, units: dict[str, str]) -> Announcement:
    return Announcement(service=service, instance=name, units=units, announced_at=0.0)


def test_a_catalogue_hash_is_short_hex_and_depends_on_names_and_origins_not_order() -> None:
    h = catalogue_hash(PLUGIN)
    assert re.fullmatch(f"[0-9a-f]{{{c.CATALOGUE_HASH_LENGTH}}}", h)
    assert catalogue_hash(dict(reversed(list(PLUGIN.items())))) == h
    assert catalogue_hash(BUILTINS) != h
    other_version = {**PLUGIN, "RackLabelFilter": "vmsched-example-units 0.2.0"}
    assert catalogue_hash(other_version) != h
    assert instance("filter-worker", "a", PLUGIN).catalogue == h


def test_catalogue_routes_have_their_own_queue_on_the_route_s_exchange() -> None:
    route = c.catalogue_route(c.RPC_PLACE, "0123456789ab")
    assert route == "place.0123456789ab"
    assert c.rpc_queue(route) == "vmsched.filter-worker.place.0123456789ab"
    assert c.rpc_exchange(route) == c.INTERNAL_EXCHANGE
    assert c.rpc_queue(c.catalogue_route(c.RPC_WEIGH, "0123456789ab")) == "vmsched.weigher.weigh.0123456789ab"
    # the plain routes and the others are as before
    assert c.rpc_queue(c.RPC_PLACE) == c.RPC_QUEUES[c.RPC_PLACE]
    assert c.rpc_exchange(c.RPC_SCHEDULE) == c.RPC_EXCHANGE
    assert c.rpc_queue("bench-echo") == "vmsched.bench-echo"
    assert c.rpc_exchange("schedule.0123456789ab") == c.RPC_EXCHANGE  # not a catalogue route


def test_every_worker_having_the_units_keeps_the_plain_route() -> None:
    workers = [instance("filter-worker", "a", PLUGIN), instance("filter-worker", "b", PLUGIN)]
    assert choose_route(c.RPC_PLACE, ["Memory", "RackLabelFilter"], workers) == c.RPC_PLACE
    # built-in units only: the plain route even beside a worker without the plugin
    mixed = [instance("filter-worker", "a", PLUGIN), instance("filter-worker", "b", BUILTINS)]
    assert choose_route(c.RPC_PLACE, ["Memory", "RAMWeigher"], mixed) == c.RPC_PLACE
    # nothing announced (a bus without the runner): the plain route
    assert choose_route(c.RPC_PLACE, ["RackLabelFilter"], []) == c.RPC_PLACE


def test_a_policy_some_workers_lack_units_of_goes_to_the_catalogue_of_those_that_have_them() -> None:
    mixed = [
        instance("filter-worker", "plain", BUILTINS),
        instance("filter-worker", "racks", PLUGIN),
        # a weigher without the plugin does not matter to filter-worker routes
        instance("weigher", "w", BUILTINS),
    ]
    route = choose_route(c.RPC_PLACE, ["Memory", "RackLabelFilter"], mixed)
    assert route == c.catalogue_route(c.RPC_PLACE, catalogue_hash(PLUGIN))
    assert choose_route(c.RPC_FILTER, ["RackLabelFilter"], mixed) == f"filter.{catalogue_hash(PLUGIN)}"
    # the weigher lacks the weight: no weigher can run it
    with pytest.raises(UnitsUnavailable) as refused:
        choose_route(c.RPC_WEIGH, ["RackSpreadWeight"], mixed, policy="racks")
    assert "no running weigher has every unit of policy racks (missing: RackSpreadWeight)" in str(refused.value)
    assert f"weigher w (catalogue {catalogue_hash(BUILTINS)}) lacks RackSpreadWeight" in str(refused.value)
    assert refused.value.retryable
    assert refused.value.code == "units_unavailable"


def test_among_several_catalogues_having_the_units_the_most_shared_one_wins() -> None:
    extra = {**PLUGIN, "Other": "other-units 1.0"}
    workers = [
        instance("filter-worker", "a", extra),
        instance("filter-worker", "b", PLUGIN),
        instance("filter-worker", "c", PLUGIN),
        instance("filter-worker", "d", BUILTINS),
    ]
    assert choose_route(c.RPC_PLACE, ["RackLabelFilter"], workers) == f"place.{catalogue_hash(PLUGIN)}"
    # the one catalogue with Other
    assert choose_route(c.RPC_PLACE, ["RackLabelFilter", "Other"], workers) == f"place.{catalogue_hash(extra)}"


def test_a_catalogue_found_with_no_consumer_is_left_out_whatever_its_announcement_says() -> None:
    extra = {**PLUGIN, "Other": "other-units 1.0"}
    workers = [
        instance("filter-worker", "a", extra),
        instance("filter-worker", "b", PLUGIN),
        instance("filter-worker", "c", BUILTINS),
    ]
    # b's catalogue queue had no consumer: a (a catalogue of its own, with the units too) takes it.
    gone = [catalogue_hash(PLUGIN)]
    assert choose_route(c.RPC_PLACE, ["RackLabelFilter"], workers, gone=gone) == f"place.{catalogue_hash(extra)}"
    # Nobody left with the units: refused, naming the one still running without them.
    with pytest.raises(UnitsUnavailable, match="filter-worker c"):
        choose_route(c.RPC_PLACE, ["RackLabelFilter"], workers, gone=[*gone, catalogue_hash(extra)])


def test_no_worker_with_every_unit_names_each_instance_and_what_it_lacks() -> None:
    workers = [instance("filter-worker", "fw-1", BUILTINS), instance("filter-worker", "fw-2", PLUGIN)]
    with pytest.raises(UnitsUnavailable) as refused:
        choose_route(c.RPC_PLACE, ["RackLabelFilter", "Nowhere"], workers, policy="p")
    message = str(refused.value)
    assert "missing: Nowhere, RackLabelFilter" in message
    assert f"filter-worker fw-1 (catalogue {catalogue_hash(BUILTINS)}) lacks Nowhere, RackLabelFilter" in message
    assert f"filter-worker fw-2 (catalogue {catalogue_hash(PLUGIN)}) lacks Nowhere;" in message


def test_policy_admin_refuses_only_what_no_worker_can_run_and_warns_about_instances_lacking_units() -> None:
    doc = PolicyDocument(
        name="racks",
        filters=[{"unit": "Memory"}, {"unit": "RackLabelFilter"}],
        weights=[],
    )
    mixed = [instance("filter-worker", "plain", BUILTINS), instance("filter-worker", "racks", PLUGIN)]
    problems, warnings = routed_check(doc, REGISTRY, mixed)
    assert problems == []
    assert warnings == [
        "policy racks: 1 of 2 running filter-worker instance(s) lack units it uses (plain lacks RackLabelFilter); "
        "its calls go to the 1 that have every one"
    ]
    problems, warnings = routed_check(doc, REGISTRY, [mixed[0]])
    assert warnings == []
    [problem] = problems
    assert "no running filter-worker has every unit (missing: RackLabelFilter)" in problem
    # the balancer is not routed: every instance must have a unit, as before
    balancers = [instance("balancer", "b1", BUILTINS), instance("balancer", "b2", {})]
    assert strict_available([*mixed, *balancers]) == {"balancer": frozenset()}


def test_running_instances_show_plugin_units_and_what_each_lacks() -> None:
    listed = running_instances(
        [instance("filter-worker", "plain", BUILTINS), instance("filter-worker", "racks", PLUGIN)]
    )
    plain, racks = listed
    assert (plain.catalogue, plain.units, plain.plugins, plain.lacks) == (
        catalogue_hash(BUILTINS),
        3,
        {},
        ["RackLabelFilter", "RackSpreadWeight"],
    )
    assert racks.plugins == {
        "RackLabelFilter": PLUGIN["RackLabelFilter"],
        "RackSpreadWeight": PLUGIN["RackSpreadWeight"],
    }
    assert racks.lacks == []


def test_a_worker_refuses_a_request_naming_a_unit_it_lacks_naming_itself(capsys: pytest.CaptureFixture[str]) -> None:
    check_units("filter-worker", "me-1", ["Memory"], REGISTRY)  # has it
    with pytest.raises(UnitsUnavailable) as refused:
        check_units("filter-worker", "me-1", ["Memory", "NoSuchUnit"], REGISTRY)
    assert str(refused.value).startswith("policy: filter-worker me-1 (catalogue ")
    assert "lacks NoSuchUnit" in str(refused.value)
    assert "a request names units this instance lacks instance=me-1" in capsys.readouterr().err


def test_workers_of_catalogue_routes_may_declare_and_bind_their_catalogue_queues_only() -> None:
    granted = grants(Settings(amqp_prefix="t."))
    fw, weigher, selector = granted["filter-worker"], granted["weigher"], granted["selector"]
    mine = "t.vmsched.filter-worker.place.0123456789ab"
    for rights in (fw.configure, fw.write, fw.read):
        assert re.match(rights, mine)
        assert re.match(rights, "t.vmsched.filter-worker.filter.0123456789ab")
        assert not re.match(rights, "t.vmsched.weigher.weigh.0123456789ab")
        assert not re.match(rights, "t.vmsched.filter-worker.place.zz")
    assert re.match(fw.read, "t.vmsched.internal")  # binding needs read on the exchange
    assert re.match(weigher.configure, "t.vmsched.weigher.weigh.0123456789ab")
    assert not re.match(selector.configure, mine)
