"""The wire codec (vmsched.bus.codec) and AMQP topic matching as MemoryBus does it."""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import structlog.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from vmsched.bus import codec
from vmsched.bus.codec import (
    ERROR_MESSAGE_MAX,
    decode,
    decode_any,
    describe_validation_error,
    encode,
    error_reply,
    truncate,
    type_name,
)
from vmsched.bus.memory import topic_matches
from vmsched.contracts import (
    ClusterReport,
    ErrorReply,
    FilterRequest,
    HostReport,
    HostStatus,
    Message,
    ScheduleRequest,
    StateReports,
    StateRequest,
    UnitCall,
    VmReport,
    VmSpec,
    VmStatus,
)
from vmsched.errors import InvalidRequest


def filter_request(**vm: object) -> dict[str, object]:
    fields: dict[str, object] = {"vm_id": "vm1", "mem_mb": 1024, "vcpus": 2}
    fields.update(vm)
    return {
        "request_id": str(uuid.uuid4()),
        "cluster_id": "c1",
        "state_version": 3,
        "vm": fields,
        "candidates": ["h1", "h2"],
        "filters": [{"unit": "Memory"}],
    }


HOST = HostReport(
    cluster_id="c1", host_id="h1", status=HostStatus.UP, cpu_cores=8, physical_mem_mb=4096, mem_free_mb=4096
)
VM = VmReport(cluster_id="c1", vm_id="vm1", status=VmStatus.RUNNING, host_id="h1", mem_mb=1024, vcpus=2)
STATE_MODELS: dict[str, type[Message]] = {"HostReport": HostReport, "VmReport": VmReport}


# ---------------------------------------------------------------------------------------- encode / decode
def test_round_trip_keeps_the_model() -> None:
    request = FilterRequest(
        request_id=uuid.uuid4(),
        cluster_id="c1",
        state_version=3,
        vm=VmSpec(vm_id="vm1", mem_mb=1024, vcpus=2, networks=["n1"]),
        candidates=["h1", "h2"],
        filters=[UnitCall(unit="Memory", factor=2.0, properties={"mode": "strict"})],
    )
    body = encode(request)
    assert isinstance(body, bytes)
    assert json.loads(body)["vm"]["mem_mb"] == 1024
    assert decode(body, FilterRequest) == request


def test_type_name_of_class_and_instance() -> None:
    assert type_name(HostReport) == "HostReport"
    assert type_name(HOST) == "HostReport"


def test_error_names_the_nested_location_and_the_value() -> None:
    body = json.dumps(filter_request(mem_mb=-5)).encode()
    with pytest.raises(InvalidRequest) as info:
        decode(body, FilterRequest)
    err = info.value
    assert err.location == "vm.mem_mb"
    assert err.code == "invalid_request"
    assert err.message.startswith("invalid FilterRequest: vm.mem_mb: ")
    assert "greater than or equal to 1" in err.message
    assert "(got -5)" in err.message
    # the message already names the location: str() does not repeat it
    assert str(err) == err.message


def test_error_in_a_list_item_names_its_index() -> None:
    fields = filter_request()
    fields["filters"] = [{"unit": "Memory"}, {"unit": "has space"}]
    with pytest.raises(InvalidRequest) as info:
        decode(json.dumps(fields).encode(), FilterRequest)
    assert info.value.location == "filters.1.unit"


def test_missing_and_unknown_fields_are_named() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(b"{}", StateRequest)
    assert info.value.location == "cluster_id"
    assert "Field required" in info.value.message

    with pytest.raises(InvalidRequest) as info:
        decode(b'{"cluster_id": "c1", "colour": "red"}', StateRequest)
    assert info.value.location == "colour"
    assert "Extra inputs are not permitted" in info.value.message


def test_wrong_schema_version_is_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(b'{"cluster_id": "c1", "schema_version": 2}', StateRequest)
    assert info.value.location == "schema_version"


@pytest.mark.parametrize("body", [b"", b"{", b"not json", b'{"cluster_id": "c1",}', b"\xff\xfe"])
def test_malformed_json_is_invalid_request_on_the_whole_message(body: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(body, StateRequest)
    assert info.value.location == "(message)"
    assert info.value.message.startswith("invalid StateRequest: ")


def test_json_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(b'["c1"]', StateRequest)
    assert info.value.location == "(message)"
    assert "Input should be an object" in info.value.message


def test_many_errors_are_summarised() -> None:
    errors = {f"extra{i}": i for i in range(8)}
    with pytest.raises(InvalidRequest) as info:
        decode(json.dumps({"cluster_id": "c1", **errors}).encode(), StateRequest)
    assert info.value.message.count("Extra inputs are not permitted") == 5
    assert info.value.message.endswith("... and 3 more")


def test_long_inputs_are_cut_in_the_message() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(json.dumps({"cluster_id": "bad id " * 100}).encode(), StateRequest)
    assert info.value.location == "cluster_id"
    assert "..." in info.value.message
    assert len(info.value.message) < 300


def test_a_huge_nested_input_is_quoted_by_its_first_items_only() -> None:
    # The text quotes the start of a 100,000-item value instead of copying all of it first.
    huge = [[i, {"k": "v" * 100}] for i in range(100_000)]
    with pytest.raises(InvalidRequest) as info:
        decode(json.dumps({"cluster_id": huge}).encode(), StateRequest)
    assert info.value.location == "cluster_id"
    assert "[0, {...}], [1, {...}]" in info.value.message
    assert len(info.value.message) < 300


def test_describe_validation_error_gives_text_and_first_location() -> None:
    with pytest.raises(ValidationError) as info:
        VmSpec.model_validate({"vm_id": "", "mem_mb": 0, "vcpus": 1})
    text, first = describe_validation_error(info.value)
    assert first == "vm_id"
    assert text.startswith("vm_id: ")
    assert "; mem_mb: " in text


def test_oversized_message_is_refused_before_parsing() -> None:
    body = json.dumps({"cluster_id": "c1", "pad": "x" * 2000}).encode()  # also invalid: size is checked first
    with pytest.raises(InvalidRequest) as info:
        decode(body, StateRequest, max_bytes=1024)
    assert info.value.message == f"message of {len(body)} bytes exceeds the limit of 1024 bytes"
    assert info.value.location is None


def test_message_at_the_limit_is_accepted() -> None:
    body = encode(StateRequest(cluster_id="c1"))
    assert decode(body, StateRequest, max_bytes=len(body)) == StateRequest(cluster_id="c1")
    with pytest.raises(InvalidRequest):
        decode(body, StateRequest, max_bytes=len(body) - 1)


# ---------------------------------------------------------------------------------------- unknown fields
def _with_fields(message: Message, **extra: object) -> bytes:
    return json.dumps({**json.loads(encode(message)), **extra}).encode()


def _unknown_field_warnings(logs: Sequence[Mapping[str, Any]]) -> list[tuple[object, object]]:
    return [(e["message_type"], e["field"]) for e in logs if str(e["event"]).startswith("unknown field ignored")]


@pytest.mark.parametrize("event", [HOST, VM, ClusterReport(cluster_id="c1")], ids=type_name)
def test_an_engine_event_with_unknown_fields_decodes_without_them(event: Message) -> None:
    """A newer engine's report is applied, not dead-lettered: the fields this version lacks are dropped."""
    field = f"gpu_{uuid.uuid4().hex[:8]}"
    body = _with_fields(event, **{field: {"count": 2, "model": ["a100"]}, "schema_version": 1})
    decoded = decode(body, type(event))
    assert decoded == event
    assert decoded.__pydantic_extra__ == {}
    assert field not in json.loads(encode(decoded))  # nothing unknown is stored or forwarded


def test_the_reports_a_state_reports_carries_decode_without_their_unknown_fields() -> None:
    """The reports inside one message are events too: what a newer engine added is dropped from each."""
    field = f"gpu_{uuid.uuid4().hex[:8]}"
    message = StateReports(cluster_id="c1", hosts=[HOST], vms=[VM, VM])
    raw = json.loads(encode(message))
    raw["hosts"][0][field] = 1
    raw["vms"][1][field] = {"x": [1, 2]}
    decoded = decode(json.dumps(raw).encode(), StateReports)
    assert decoded == message
    assert all(r.__pydantic_extra__ == {} for r in decoded.reports())
    assert field not in encode(decoded).decode()


@pytest.mark.parametrize(
    ("hosts", "vms", "says"),
    [
        ([], [], "no reports"),
        ([HOST], [VM.model_copy(update={"cluster_id": "c2"})], "vms[0] names cluster 'c2'"),
        ([HOST.model_copy(update={"cluster_id": "c2"})], [], "hosts[0] names cluster 'c2'"),
        ([HOST] * 600, [VM] * 401, "1001 reports; at most 1000"),
    ],
)
def test_a_state_reports_message_out_of_bounds_is_refused_saying_where(
    hosts: list[HostReport], vms: list[VmReport], says: str
) -> None:
    body = json.dumps(
        {
            "cluster_id": "c1",
            "hosts": [json.loads(encode(h)) for h in hosts],
            "vms": [json.loads(encode(v)) for v in vms],
        }
    ).encode()
    with pytest.raises(InvalidRequest, match=re.escape(says)):
        decode(body, StateReports)


@pytest.fixture
def fresh_codec_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    """The codec's logger, not yet bound: a test that ran services in this process configured
    structlog to cache loggers on first use, and a cached one would bypass capture_logs."""
    monkeypatch.setattr(codec, "log", structlog.get_logger(codec.__name__))


@pytest.mark.usefixtures("fresh_codec_logger")
def test_each_unknown_field_is_logged_once_per_message_type_and_field() -> None:
    first, second = f"a_{uuid.uuid4().hex[:8]}", f"b_{uuid.uuid4().hex[:8]}"
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            decode(_with_fields(HOST, **{first: 1, second: "x"}), HostReport)
            decode(_with_fields(VM, **{first: 1}), VmReport)
    assert sorted(_unknown_field_warnings(logs)) == sorted(
        [("HostReport", first), ("HostReport", second), ("VmReport", first)]
    )
    assert all(e["log_level"] == "warning" for e in logs)


@pytest.mark.usefixtures("fresh_codec_logger")
def test_unknown_field_logging_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A publisher inventing a field name per message cannot grow the logged set (or the log) without end."""
    monkeypatch.setattr(codec, "UNKNOWN_FIELDS", codec.UnknownFields(limit=3))
    with structlog.testing.capture_logs() as logs:
        for i in range(20):
            assert decode(_with_fields(HOST, **{f"f{i}" + "x" * 500: i}), HostReport) == HOST
    assert len(_unknown_field_warnings(logs)) == 3
    assert all(len(str(field)) <= codec.UNKNOWN_NAME_MAX for _, field in _unknown_field_warnings(logs))
    assert [e["event"] for e in logs].count("too many different unknown fields: no more are logged") == 1
    assert len(codec.UNKNOWN_FIELDS) == 4


@pytest.mark.usefixtures("fresh_codec_logger")
def test_a_reset_logs_a_field_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "UNKNOWN_FIELDS", codec.UnknownFields())
    field = f"c_{uuid.uuid4().hex[:8]}"
    with structlog.testing.capture_logs() as logs:
        decode(_with_fields(HOST, **{field: 1}), HostReport)
        decode(_with_fields(HOST, **{field: 1}), HostReport)
        codec.UNKNOWN_FIELDS.reset()
        decode(_with_fields(HOST, **{field: 1}), HostReport)
    assert _unknown_field_warnings(logs) == [("HostReport", field)] * 2


@pytest.mark.parametrize(
    ("body", "location"),
    [
        (lambda: {**filter_request(), "colour": "red"}, "colour"),
        (lambda: filter_request(colour="red"), "vm.colour"),
    ],
    ids=["top-level", "nested"],
)
def test_rpc_requests_still_refuse_unknown_fields(body: Callable[[], dict[str, object]], location: str) -> None:
    with structlog.testing.capture_logs() as logs, pytest.raises(InvalidRequest) as info:
        decode(json.dumps(body()).encode(), FilterRequest)
    assert info.value.location == location
    assert "Extra inputs are not permitted" in info.value.message
    assert _unknown_field_warnings(logs) == []


def test_a_schedule_request_refuses_unknown_fields() -> None:
    request = {"request_id": str(uuid.uuid4()), "cluster_id": "c1", "vm": {"vm_id": "v", "mem_mb": 1, "vcpus": 1}}
    assert decode(json.dumps(request).encode(), ScheduleRequest).cluster_id == "c1"
    with pytest.raises(InvalidRequest) as info:
        decode(json.dumps({**request, "priorty": 5}).encode(), ScheduleRequest)
    assert info.value.location == "priorty"


# ---------------------------------------------------------------------------------------- decode_any
def test_decode_any_picks_the_model_by_type() -> None:
    assert decode_any(encode(HOST), "HostReport", STATE_MODELS) == HOST
    assert decode_any(encode(VM), "VmReport", STATE_MODELS) == VM


def test_decode_any_validates_against_the_named_model() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode_any(encode(HOST), "VmReport", STATE_MODELS)  # a host report labelled as a VM report
    assert info.value.message.startswith("invalid VmReport: ")


def test_decode_any_refuses_an_unknown_type() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode_any(encode(ClusterReport(cluster_id="c1")), "ClusterReport", STATE_MODELS)
    assert info.value.message == "unexpected message type 'ClusterReport'; expected one of ['HostReport', 'VmReport']"


def test_decode_any_without_type_needs_a_single_model() -> None:
    assert decode_any(encode(HOST), None, {"HostReport": HostReport}) == HOST
    with pytest.raises(InvalidRequest) as info:
        decode_any(encode(HOST), None, STATE_MODELS)
    assert "no type property" in info.value.message


def test_decode_any_applies_the_size_limit() -> None:
    body = encode(HOST)
    with pytest.raises(InvalidRequest) as info:
        decode_any(body, "HostReport", STATE_MODELS, max_bytes=len(body) - 1)
    assert "exceeds the limit" in info.value.message


# ---------------------------------------------------------------------------------------- topic_matches
@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("decision.*", "decision.c1", True),
        ("decision.*", "decision", False),
        ("decision.*", "decision.c1.x", False),
        ("decision.*", "policy.changed", False),
        ("decision.c1", "decision.c1", True),
        ("decision.c1", "decision.c2", False),
        ("*.c1", "decision.c1", True),
        ("*", "policy", True),
        ("*", "policy.changed", False),
        ("*.*", "policy.changed", True),
        ("state.#", "state", True),
        ("state.#", "state.host.c1", True),
        ("state.#", "state.vm.c1", True),
        ("state.#", "stately.host", False),
        ("state.#", "decision.c1", False),
        ("#", "anything.at.all", True),
        ("#", "one", True),
        ("#.c1", "c1", True),
        ("#.c1", "state.host.c1", True),
        ("#.c1", "state.host.c2", False),
        ("state.#.c1", "state.c1", True),
        ("state.#.c1", "state.host.c1", True),
        ("state.#.c1", "state.host.x.c1", True),
        ("state.#.c1", "state.host.c2", False),
        ("state.*.#", "state", False),
        ("state.*.#", "state.host", True),
        ("#.#", "a.b", True),
        ("*.#.*", "a", False),
        ("*.#.*", "a.b", True),
        ("*.#.*", "a.b.c.d", True),
    ],
)
def test_topic_matches(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected


def _reference_match(pattern: list[str], key: list[str]) -> bool:
    """Brute force: expand every # to 0..len(key) words, then compare word by word."""
    hashes = [i for i, p in enumerate(pattern) if p == "#"]
    for counts in itertools.product(range(len(key) + 1), repeat=len(hashes)):
        expanded: list[str] = []
        n = iter(counts)
        for p in pattern:
            expanded.extend(["*"] * next(n) if p == "#" else [p])
        if len(expanded) == len(key) and all(p in ("*", k) for p, k in zip(expanded, key, strict=True)):
            return True
    return False


WORDS = st.sampled_from(["a", "b", "c"])
KEYS = st.lists(WORDS, min_size=1, max_size=5)
PATTERNS = st.lists(st.sampled_from(["a", "b", "*", "#"]), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(pattern=PATTERNS, key=KEYS)
def test_topic_matches_agrees_with_brute_force(pattern: list[str], key: list[str]) -> None:
    assert topic_matches(".".join(pattern), ".".join(key)) is _reference_match(pattern, key)


@settings(max_examples=100, deadline=None)
@given(key=KEYS, data=st.data())
def test_a_key_matches_itself_and_its_generalisations(key: list[str], data: st.DataObject) -> None:
    assert topic_matches(".".join(key), ".".join(key))
    assert topic_matches("#", ".".join(key))
    i = data.draw(st.integers(0, len(key) - 1))
    star = [*key[:i], "*", *key[i + 1 :]]
    assert topic_matches(".".join(star), ".".join(key))
    j = data.draw(st.integers(i, len(key)))
    hashed = [*key[:i], "#", *key[j:]]  # words i..j-1 (possibly none) collapse into one #
    assert topic_matches(".".join(hashed), ".".join(key))
    assert not topic_matches(".".join([*key, "extra"]), ".".join(key))


# ---------------------------------------------------------------------------------------- error texts
@settings(max_examples=200)
@given(text=st.text(max_size=30_000), limit=st.integers(min_value=40, max_value=10_000))
def test_truncate_keeps_short_text_and_bounds_long_text(text: str, limit: int) -> None:
    cut = truncate(text, limit)
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
    else:
        assert cut.endswith("more characters cut]")
        assert text.startswith(cut[: cut.rindex("... [")])


@settings(max_examples=100)
@given(code=st.text(max_size=80), message=st.text(max_size=20_000), location=st.none() | st.text(max_size=2000))
def test_error_reply_accepts_anything_and_fits_the_model(code: str, message: str, location: str | None) -> None:
    reply = error_reply(code, message, location)
    assert decode(encode(reply), ErrorReply) == reply  # valid on the wire, whatever went in
    assert len(reply.message) <= ERROR_MESSAGE_MAX
