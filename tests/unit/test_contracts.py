"""contracts/ is the public API: it must match the models, and the models must be strict."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from vmsched.contracts import HostReport, Message, ScheduleRequest, VmSpec
from vmsched.contracts.asyncapi import ALL_MODELS, RPCS, asyncapi, check

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


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_models_refuse_unknown_fields_and_are_frozen(model: type[Message]) -> None:
    schema = model.model_json_schema()
    assert schema.get("additionalProperties") is False
    assert model.model_config.get("frozen") is True
    assert schema["properties"]["schema_version"]["const"] == 1


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
