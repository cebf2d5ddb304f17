"""contracts/ is the public API: it must match the models, say everything an engine needs (every
field's meaning and unit, every wire rule), and the models must be strict except where an engine's
newer events must get through."""

from __future__ import annotations

import json
import re
import typing
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from vmsched import constants, errors
from vmsched.bus import dispatch
from vmsched.contracts import (
    ClusterReport,
    HostReport,
    Message,
    ResyncComplete,
    ScheduleRequest,
    StateReports,
    VmReport,
    VmSpec,
)
from vmsched.contracts.base import EngineEvent
from vmsched_services.tools.asyncapi import ALL_MODELS, EVENTS, RPCS, asyncapi, check
from vmsched_services.tools.security.roles import ROLES

ROOT = Path(__file__).resolve().parents[2]


def test_committed_contracts_match_the_models() -> None:
    problems = check(ROOT / "contracts")
    assert problems == [], f"run `vmsched contracts` and commit: {problems}"


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def test_every_reference_in_the_asyncapi_document_resolves() -> None:
    doc = asyncapi()
    refs = _refs(doc)
    assert refs
    for ref in refs:
        _resolve(doc, ref)


def test_every_rpc_has_a_request_and_a_reply_channel() -> None:
    doc = asyncapi()
    for name, key, req, rep, _, _ in RPCS:
        op = doc["operations"][name]
        assert op["action"] == "receive"
        assert doc["channels"][name]["address"] == key
        reply_messages = doc["channels"][f"{name}Reply"]["messages"]
        assert set(reply_messages) == {rep.__name__, "ErrorReply"}
        assert req.__name__ in doc["channels"][name]["messages"]


#: The events engines publish: fields this version does not know are ignored (and logged), so a
#: newer engine's state is not dead-lettered. Every other model refuses them.
ENGINE_EVENTS: set[type[Message]] = {ClusterReport, HostReport, VmReport, StateReports, ResyncComplete}


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation names, however deep (list[X], X | None, dict[K, X], Annotated[X, ...])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested_models(arg)]


def _contract_models() -> list[type[BaseModel]]:
    """Every message model of vmsched.contracts, and every model nested in one (not the bases)."""
    found: dict[str, type[BaseModel]] = {}
    todo: list[type[BaseModel]] = [*ALL_MODELS]
    stack: list[type[Message]] = [Message]
    while stack:
        cls = stack.pop()
        stack += cls.__subclasses__()
        if cls.__module__.startswith("vmsched.contracts.") and cls not in (Message, EngineEvent):
            todo.append(cls)
    while todo:
        model = todo.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            todo += _nested_models(field.annotation)
    return sorted(found.values(), key=lambda m: m.__name__)


CONTRACT_MODELS = _contract_models()


def test_the_model_walk_finds_nested_and_unlisted_models() -> None:
    names = {m.__name__ for m in CONTRACT_MODELS}
    assert {"VmSpec", "AffinityRule", "HostState", "PendingEntry", "UnitScores", "PlaceItem"} <= names
    assert {m.__name__ for m in ALL_MODELS} <= names


@pytest.mark.parametrize("model", CONTRACT_MODELS, ids=lambda m: m.__name__)
def test_every_field_has_a_description(model: type[BaseModel]) -> None:
    missing = [name for name, field in model.model_fields.items() if not (field.description or "").strip()]
    assert missing == [], f"{model.__name__}: fields without a description: {missing}"


#: Field name endings and the unit their description must name.
UNITS = {
    "_mb": "MB",
    "_kb": "KiB",
    "_pct": "percent",
    "_ms": "milliseconds",
    "_s": "seconds",
}


@pytest.mark.parametrize("model", CONTRACT_MODELS, ids=lambda m: m.__name__)
def test_descriptions_name_the_unit(model: type[BaseModel]) -> None:
    for name, field in model.model_fields.items():
        description = field.description or ""
        for ending, unit in UNITS.items():
            if name.endswith(ending):
                assert unit in description, f"{model.__name__}.{name}: {description!r} does not say {unit}"
        if name.endswith("_at") or name in {"now", "deadline"}:
            assert "ISO 8601" in description or "unix seconds" in description, f"{model.__name__}.{name}"


def test_the_generated_schemas_carry_every_description() -> None:
    """Descriptions reach the JSON schemas an engine is written from, nested models and enums included."""
    schemas = asyncapi()["components"]["schemas"]
    for name, schema in schemas.items():
        assert schema.get("description"), f"schema {name} has no description"
        for prop, sub in schema.get("properties", {}).items():
            assert sub.get("description"), f"{name}.{prop} has no description in the schema"


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_models_are_frozen_versioned_and_strict_unless_an_engine_event(model: type[Message]) -> None:
    schema = model.model_json_schema()
    assert schema.get("additionalProperties") is (model in ENGINE_EVENTS)
    assert model.model_config.get("frozen") is True
    assert schema["properties"]["schema_version"]["const"] == 1


def test_only_engine_events_tolerate_unknown_fields() -> None:
    tolerant = {m for m in CONTRACT_MODELS if m.model_config.get("extra") != "forbid"}
    assert tolerant == ENGINE_EVENTS
    messages = asyncapi()["components"]["messages"]
    for model in ALL_MODELS:
        expected = "ignored" if model in ENGINE_EVENTS else "refused"
        assert messages[model.__name__]["x-vmsched-unknown-fields"] == expected


@pytest.mark.parametrize("request_model", [req for _, _, req, _, _, _ in RPCS], ids=lambda m: m.__name__)
def test_rpc_requests_refuse_unknown_fields_at_every_depth(request_model: type[Message]) -> None:
    todo: list[type[BaseModel]] = [request_model]
    while todo:
        model = todo.pop()
        assert model.model_config.get("extra") == "forbid", f"{request_model.__name__} nests {model.__name__}"
        for field in model.model_fields.values():
            todo += _nested_models(field.annotation)


def test_an_engine_event_model_keeps_unknown_fields_for_the_decoder_to_drop() -> None:
    report = HostReport.model_validate(
        {"cluster_id": "c", "host_id": "h", "status": "up", "cpu_cores": 1, "physical_mem_mb": 1, "mem_free_mb": 1}
        | {"gpus": 2}
    )
    assert report.__pydantic_extra__ == {"gpus": 2}
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ScheduleRequest.model_validate(
            {"request_id": str(uuid.uuid4()), "cluster_id": "c1", "vm": {"vm_id": "v", "mem_mb": 1, "vcpus": 1}}
            | {"gpus": 2}
        )


def test_a_deadline_needs_a_utc_offset() -> None:
    """A naive deadline cannot be compared with the selector's clock: refused at the door, not mid-decision."""
    fields = {"request_id": str(uuid.uuid4()), "cluster_id": "c1", "vm": {"vm_id": "v", "mem_mb": 1, "vcpus": 1}}
    assert ScheduleRequest.model_validate({**fields, "deadline": "2030-01-01T00:00:00Z"}).deadline is not None
    with pytest.raises(ValidationError, match="timezone"):
        ScheduleRequest.model_validate({**fields, "deadline": "2030-01-01T00:00:00"})


# ---------------------------------------------------------------------------------------- wire rules
def _header_constants() -> dict[str, str]:
    found = {}
    for module in (constants, dispatch):
        for name, value in vars(module).items():
            if name.startswith("HEADER_") and isinstance(value, str):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_the_document_names_every_header() -> None:
    headers = _header_constants()
    assert len(headers) >= 8
    text = json.dumps(asyncapi())
    for where, header in headers.items():
        assert json.dumps(header) in text, f"{where} ({header}) is not in asyncapi.json"
    traits = asyncapi()["components"]["messageTraits"]
    assert set(traits["rpcReply"]["headers"]["properties"]) == {constants.HEADER_ERROR}
    assert dispatch.HEADER_DEADLINE in traits["rpcRequest"]["headers"]["properties"]


def _codes_raised() -> set[str]:
    codes = {"internal"}
    stack: list[type[BaseException]] = [errors.VmschedError]
    while stack:
        cls = stack.pop()
        stack += cls.__subclasses__()
        if cls.__module__ == errors.__name__:
            codes.add(cls.code)  # type: ignore[attr-defined]  # every VmschedError has one
    return codes


def test_the_document_lists_every_error_code_with_its_meaning() -> None:
    listed = asyncapi()["x-vmsched-error-codes"]
    assert set(listed) == _codes_raised()
    assert {"invalid_request", "unknown_cluster", "internal", "policy_not_found", "stale_state"} <= set(listed)
    for code, meaning in listed.items():
        assert len(meaning) > 10, f"{code}: {meaning!r}"
        assert "also a" not in meaning, f"{code}: Python's exception classes are not the wire's business"


def test_the_document_names_every_queue_and_exchange_and_who_declares_them() -> None:
    doc = asyncapi()
    queues = {q["name"]: q for q in doc["x-vmsched-queues"]}
    assert set(queues) == {
        *constants.RPC_QUEUES.values(),
        constants.STATE_EVENTS_QUEUE,
        constants.ENGINE_EVENTS_QUEUE,
        constants.DEAD_LETTER_QUEUE,
        # each worker of a catalogue route also consumes its catalogue's queue (vmsched.lifecycle.routes)
        *(f"{constants.RPC_QUEUES[route]}.<catalogue>" for route in constants.CATALOGUE_ROUTES),
    }
    place = queues[f"{constants.RPC_QUEUES[constants.RPC_PLACE]}.<catalogue>"]
    assert re.fullmatch(place["namePattern"], constants.rpc_queue(constants.catalogue_route("place", "0123456789ab")))
    for queue in queues.values():
        assert queue["declaredBy"]
        assert queue["bindings"]
        assert queue["durable"] is True
    assert queues[constants.STATE_EVENTS_QUEUE]["bindings"] == [
        {"exchange": constants.EVENTS_EXCHANGE, "routingKey": constants.STATE_EVENTS_BINDING}
    ]
    names = doc["x-vmsched-names"]
    assert names["setting"] == "VMSCHED_AMQP_PREFIX"
    assert set(names["prefixedQueues"]) == set(queues)
    assert set(names["prefixedExchanges"]) == {e["name"] for e in doc["x-vmsched-exchanges"].values()}
    assert {*constants.RPC_EXCHANGES, constants.EVENTS_EXCHANGE, constants.DEAD_LETTER_EXCHANGE} == set(
        names["prefixedExchanges"]
    )


def test_the_document_gives_every_role_its_permissions() -> None:
    listed = asyncapi()["x-vmsched-roles"]
    assert set(ROLES) <= set(listed)
    engine = listed["engine"]
    assert engine["configure"] == "^$"
    assert "vmsched\\.admin" not in engine["write"]
    assert "vmsched\\.internal" not in engine["write"]


def test_every_message_names_its_amqp_type_and_traits() -> None:
    doc = asyncapi()
    for model in ALL_MODELS:
        message = doc["components"]["messages"][model.__name__]
        assert message["bindings"]["amqp"]["messageType"] == model.__name__
        assert message["traits"], model.__name__
    for name, _, req, rep, _, _ in RPCS:
        assert doc["operations"][name]["x-vmsched-reply-to"] == "amq.rabbitmq.reply-to"
        assert {"$ref": "#/components/messageTraits/rpcRequest"} in doc["components"]["messages"][req.__name__][
            "traits"
        ]
        assert {"$ref": "#/components/messageTraits/rpcReply"} in doc["components"]["messages"][rep.__name__]["traits"]


def test_cluster_keyed_events_agree_with_the_event_channels() -> None:
    """The routing keys the dispatcher checks are the ones the document tells publishers to use."""
    keyed = {
        model.__name__: address.removesuffix(".{clusterId}")
        for _, address, model, _, _ in EVENTS
        if address.endswith(".{clusterId}")
    }
    assert keyed == constants.CLUSTER_KEYED_EVENTS


def test_schema_files_are_valid_json_with_ids() -> None:
    for path in (ROOT / "contracts" / "schemas").glob("*.json"):
        schema = json.loads(path.read_text())
        assert schema["$id"].endswith(f"/{path.name}")
        assert schema["title"] == path.stem


def test_bad_input_names_where_it_is_wrong() -> None:
    with pytest.raises(ValidationError) as err:
        ScheduleRequest.model_validate(
            {"request_id": str(uuid.uuid4()), "cluster_id": "c1", "vm": {"vm_id": "v", "mem_mb": -5, "vcpus": 1}}
        )
    assert err.value.errors()[0]["loc"] == ("vm", "mem_mb")
    with pytest.raises(ValidationError):
        VmSpec(vm_id="v", mem_mb=1, vcpus=1, surprise=True)  # type: ignore[call-arg]  # the unknown field is the point
    with pytest.raises(ValidationError):
        HostReport(cluster_id="has space", host_id="h", status="up", cpu_cores=1, physical_mem_mb=1, mem_free_mb=1)


def test_a_migration_must_name_its_source() -> None:
    with pytest.raises(ValidationError, match="current_host"):
        ScheduleRequest(
            request_id=uuid.uuid4(),
            cluster_id="c1",
            vm=VmSpec(vm_id="v", mem_mb=1, vcpus=1),
            kind="migrate",
        )


def test_a_running_report_carries_what_the_vm_was_asked_with() -> None:
    vm = VmSpec(vm_id="vm-9", mem_mb=2048, overhead_mb=128, vcpus=4, ha=True, networks=["ovirtmgmt"])
    report = VmReport.running("c1", "h3", vm)
    assert (report.cluster_id, report.host_id, report.status.value) == ("c1", "h3", "running")
    assert (report.vm_id, report.mem_mb, report.overhead_mb, report.vcpus) == ("vm-9", 2048, 128, 4)
    assert (report.ha, report.networks) == (True, ["ovirtmgmt"])
