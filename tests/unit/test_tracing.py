"""Tracing's settings, its absence when off (not even opentelemetry imported), and what it gives when
on: nested spans, trace ids in log lines, context carried in headers, groups linked to their requests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from aio_pika import Exchange
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from vmsched import tracing
from vmsched.logging import TRACE_IDS, configure, get_logger
from vmsched.settings import Settings
from vmsched.tracing import Tracing, traces_url

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- settings
def test_tracing_is_off_unless_an_endpoint_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("VMSCHED_TRACING_ENDPOINT", raising=False)
    cfg = Settings()
    assert cfg.tracing_endpoint == ""
    assert cfg.tracing_sample_ratio == 1.0
    assert Tracing.start(cfg, "selector") is None
    assert Tracing.current is None


def test_the_endpoint_comes_from_vmsched_tracing_endpoint_else_the_standard_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert Settings().tracing_endpoint == "http://collector:4318"
    monkeypatch.setenv("VMSCHED_TRACING_ENDPOINT", "http://jaeger:4318")
    assert Settings().tracing_endpoint == "http://jaeger:4318"
    monkeypatch.setenv("VMSCHED_TRACING_SAMPLE_RATIO", "0.25")
    assert Settings().tracing_sample_ratio == 0.25


@pytest.mark.parametrize("value", ["jaeger:4318", "grpc://jaeger:4317", "http://", "http://host:port"])
def test_an_endpoint_that_is_no_http_url_is_refused_saying_what_to_write(value: str) -> None:
    with pytest.raises(ValidationError, match="VMSCHED_TRACING_ENDPOINT") as caught:
        Settings(tracing_endpoint=value)
    assert "http://host:4318" in str(caught.value) or "cannot be read" in str(caught.value)


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_a_sample_ratio_outside_zero_to_one_is_refused(ratio: float) -> None:
    with pytest.raises(ValidationError, match="tracing_sample_ratio"):
        Settings(tracing_sample_ratio=ratio)


def test_a_password_in_the_endpoint_is_a_secret() -> None:
    cfg = Settings(tracing_endpoint="https://user:s3cr3t-pw@collector:4318")
    assert "s3cr3t-pw" in cfg.secret_values()
    assert "s3cr3t-pw" not in repr(cfg)


def test_traces_url_adds_the_otlp_path_to_a_base_url_only() -> None:
    assert traces_url("http://jaeger:4318") == "http://jaeger:4318/v1/traces"
    assert traces_url("http://jaeger:4318/") == "http://jaeger:4318/v1/traces"
    assert traces_url("https://otel.example/custom/v1/traces") == "https://otel.example/custom/v1/traces"


# ---------------------------------------------------------------- off: nothing loaded
def test_with_tracing_off_vmsched_runs_without_opentelemetry_and_imports_none() -> None:
    # opentelemetry made unimportable, as where the `tracing` extra is not installed: every module a
    # service or the command loads, and the helpers the hops call, must neither need nor load it.
    script = textwrap.dedent(
        """
        import importlib.abc, json, sys

        class NoOpenTelemetry(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(f"{name} is not installed")
                return None

        sys.meta_path.insert(0, NoOpenTelemetry())
        from vmsched import tracing
        from vmsched.logging import configure, get_logger
        from vmsched.settings import Settings
        from vmsched_services import SERVICES
        from vmsched_services.runner import traced
        from vmsched_services.tools import cli
        import vmsched.client, vmsched.lifecycle, vmsched.bus.memory, vmsched_services.filter_worker.service

        cfg = Settings(tracing_endpoint="")
        assert tracing.Tracing.start(cfg, "selector") is None
        with traced(cfg, "selector"), tracing.span("x") as s, tracing.extracted({}):
            assert s is None and tracing.current_span() is None
            headers = {}
            tracing.inject(headers)
            assert headers == {}
            configure("INFO", "json", service="test")
            get_logger("t").info("a line")
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT / 'libs' / 'common'}:{ROOT / 'services'}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
    line = json.loads(run.stderr.strip().splitlines()[-1])
    assert line["event"] == "a line"
    assert "trace_id" not in line


def test_tracing_configured_without_opentelemetry_installed_says_what_to_do() -> None:
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        class NoOpenTelemetry(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, NoOpenTelemetry())
        from vmsched.errors import UsageError
        from vmsched.settings import Settings
        from vmsched.tracing import Tracing

        try:
            Tracing.start(Settings(tracing_endpoint="http://jaeger:4318"), "selector")
        except UsageError as exc:
            print(exc, "|", exc.hint)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT / 'libs' / 'common'}:{ROOT / 'services'}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "tracing is configured" in run.stdout
    assert "http://jaeger:4318" in run.stdout
    assert "pip install 'vmsched[tracing]'" in run.stdout


# ---------------------------------------------------------------- on
@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    running = Tracing.start(Settings(tracing_endpoint=""), "test", exporter=spans)
    assert running is not None
    yield spans
    running.shutdown()
    configure("WARNING", "console")  # what the rest of the suite runs with


def test_spans_nest_and_the_process_is_named(exporter: InMemorySpanExporter) -> None:
    with tracing.span("outer", {"vmsched.cluster": "c1"}, kind="client"), tracing.span("inner"):
        pass
    inner, outer = exporter.get_finished_spans()
    assert inner.parent is not None
    assert outer.context is not None
    assert inner.parent.span_id == outer.context.span_id
    assert outer.kind.name == "CLIENT"
    assert dict(outer.attributes or {}) == {"vmsched.cluster": "c1"}
    assert outer.resource.attributes["service.name"] == "vmsched-test"
    assert outer.resource.attributes["service.instance.id"]


def test_a_second_start_joins_and_only_the_last_shutdown_ends(exporter: InMemorySpanExporter) -> None:
    running = Tracing.current
    joined = Tracing.start(Settings(tracing_endpoint=""), "client", exporter=InMemorySpanExporter())
    assert joined is running
    assert joined is not None
    joined.shutdown()
    assert Tracing.current is running
    assert TRACE_IDS.source is not None


def test_log_lines_inside_a_span_carry_its_ids(
    exporter: InMemorySpanExporter, capsys: pytest.CaptureFixture[str]
) -> None:
    configure("INFO", "json", service="test")
    log = get_logger("vmsched.test_tracing")
    log.info("outside")
    with tracing.span("deciding"):
        log.info("inside")
    outside, inside = (json.loads(line) for line in capsys.readouterr().err.strip().splitlines())
    (span,) = exporter.get_finished_spans()
    assert span.context is not None
    assert "trace_id" not in outside
    assert inside["trace_id"] == f"{span.context.trace_id:032x}"
    assert inside["span_id"] == f"{span.context.span_id:016x}"


def test_headers_carry_the_trace_to_another_task(exporter: InMemorySpanExporter) -> None:
    headers: dict[str, object] = {}
    with tracing.span("sender"):
        tracing.inject(headers)
    assert "traceparent" in headers
    with tracing.extracted(headers), tracing.span("receiver"):
        pass
    sender, receiver = exporter.get_finished_spans()
    assert sender.context is not None
    assert receiver.context is not None
    assert receiver.context.trace_id == sender.context.trace_id


def test_a_group_is_a_child_of_the_first_and_linked_both_ways(exporter: InMemorySpanExporter) -> None:
    # Two requests' spans, still open while their group runs.
    with (
        tracing.span("first") as first,
        tracing.span("second") as second,
        tracing.group_span("group", first) as group,
    ):
        tracing.link_members(group, [first, second])
    finished = {s.name: s for s in exporter.get_finished_spans()}
    ids = {name: s.context.span_id for name, s in finished.items() if s.context is not None}
    g = finished["group"]
    assert g.parent is not None
    assert g.parent.span_id == ids["first"]
    assert {link.context.span_id for link in g.links} == {ids["first"], ids["second"]}
    # Each request's own span names the group: one way to it from any of their traces.
    assert {link.context.span_id for link in finished["second"].links} == {ids["group"]}


def test_shutdown_turns_the_instrumentations_and_the_log_ids_off() -> None:
    running = Tracing.start(Settings(tracing_endpoint=""), "test", exporter=InMemorySpanExporter())
    assert running is not None
    assert hasattr(Exchange.publish, "__wrapped__")  # aio-pika's publish instrumented
    running.shutdown()
    assert not hasattr(Exchange.publish, "__wrapped__")
    assert Tracing.current is None
    assert TRACE_IDS.source is None
