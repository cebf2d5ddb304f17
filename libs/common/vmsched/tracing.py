"""OpenTelemetry tracing across the hops, off unless configured (docs/operating.md, "Tracing").

Off (neither VMSCHED_TRACING_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT set, no exporter given): no
module of opentelemetry is imported, `span` hands back one shared no-op context manager and the
other helpers return at once; the decision path pays an attribute read per call.

On: `Tracing.start` (the service runner, an engine's SchedulerClient) builds the process's tracer
provider (service.name `vmsched-<service>`, a service.instance.id of its own), exporting over OTLP/HTTP
(or to the exporter a test gives), sampled at VMSCHED_TRACING_SAMPLE_RATIO unless the caller's trace
decided already; turns on the aio-pika, redis and asyncpg instrumentations, so each message
published carries its span in a W3C `traceparent` header and its consumer continues that trace,
and Redis commands and PostgreSQL queries are child spans; and gives log lines their `trace_id` and
`span_id` (vmsched.logging.TRACE_IDS). One decision is one trace: the engine's `schedule` call, the
selector's consumer and `vmsched.decide` spans, the group it was decided in, the filter-worker's
`place`, and the Redis and PostgreSQL calls of each.

A group (lifecycle.groups) decides several requests at once: its span is a child of the span of the
request at the head of the queue when the group began waiting for the lock, and linked to the
`vmsched.decide` span of every request of the group, each of which is linked back to it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from vmsched.errors import UsageError
from vmsched.logging import TRACE_IDS, get_logger
from vmsched.settings import OTEL_ENDPOINT_VARIABLE, Settings, redacted_url

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanKind, Tracer

log = get_logger("vmsched.tracing")

#: Where OTLP over HTTP takes traces, under the endpoint's base URL (as for OTEL_EXPORTER_OTLP_ENDPOINT).
TRACES_PATH = "/v1/traces"
#: The instrumentation scope of vmsched's own spans.
SCOPE = "vmsched"

Kind = Literal["internal", "client", "server", "producer", "consumer"]


class Instrumentor(Protocol):
    """What vmsched asks of an OpenTelemetry instrumentation (their BaseInstrumentor)."""

    def instrument(self, **kwargs: Any) -> Any: ...

    def uninstrument(self, **kwargs: Any) -> Any: ...


#: What `span` gives while tracing is off: one object, reused (a nullcontext can be entered again).
_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for `endpoint`: a base URL (http://jaeger:4318) gets /v1/traces; a URL
    that names a path already is taken as it is."""
    parts = urlsplit(endpoint)
    if parts.path.strip("/"):
        return endpoint
    return urlunsplit(parts._replace(path=TRACES_PATH))


class Tracing:
    """The process's tracing: its tracer provider, and the instrumentations it turned on.

    A process has at most one, `Tracing.current`: a second `start` in the same process (an engine's
    client beside services run in-process, a test) joins the running one and is counted, and the
    last `shutdown` ends it. The instrumentations patch the client libraries' classes, which are the
    process's, so two providers could not share them.
    """

    #: The running tracing, None while off. Owned by `start` and `shutdown`, the only writers.
    current: ClassVar[Tracing | None] = None

    def __init__(self, provider: TracerProvider, service: str, instrumentors: Sequence[Instrumentor]) -> None:
        from opentelemetry import context, propagate, trace

        self.provider = provider
        self.service = service
        self.tracer: Tracer = provider.get_tracer(SCOPE)
        self._instrumentors = list(instrumentors)
        self._users = 1
        # The API's modules, held so the helpers below import nothing per call.
        self._trace = trace
        self._context = context
        self._propagate = propagate

    @classmethod
    def start(cls, settings: Settings, service: str, *, exporter: SpanExporter | None = None) -> Tracing | None:
        """The process's tracing for `service` (`vmsched-<service>`), started now or joined; None when
        tracing is off (no endpoint configured and no `exporter`): then nothing is imported.

        `exporter` replaces the OTLP exporter (tests give the SDK's InMemorySpanExporter); spans then
        go to it as they end, not in batches.
        """
        if exporter is None and not settings.tracing_endpoint:
            return None
        running = cls.current
        if running is not None:
            running._users += 1
            return running
        running = cls._build(settings, service, exporter)
        cls.current = running
        TRACE_IDS.source = running.current_ids
        log.info(
            "tracing on",
            service=running.service,
            endpoint=redacted_url(traces_url(settings.tracing_endpoint)) if exporter is None else "in-process exporter",
            sample_ratio=settings.tracing_sample_ratio,
        )
        return running

    @classmethod
    def _build(cls, settings: Settings, service: str, exporter: SpanExporter | None) -> Tracing:
        try:
            return cls._built(settings, service, exporter)
        except ImportError as exc:  # configured where the `tracing` extra is not installed
            raise UsageError(
                f"tracing is configured (VMSCHED_TRACING_ENDPOINT or {OTEL_ENDPOINT_VARIABLE} is "
                f"{redacted_url(settings.tracing_endpoint)!r}) but {exc.name or 'opentelemetry'} is not installed",
                hint="install the tracing extra (pip install 'vmsched[tracing]'), or unset the variable",
            ) from None

    @classmethod
    def _built(cls, settings: Settings, service: str, exporter: SpanExporter | None) -> Tracing:
        # Imported here, and only here: a process with tracing off never loads opentelemetry.
        from opentelemetry.instrumentation.aio_pika import AioPikaInstrumentor
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
        from opentelemetry.instrumentation.redis import RedisInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        name = service if service.startswith("vmsched") else f"vmsched-{service}"
        resource = Resource.create(
            {
                "service.name": name,
                "service.namespace": "vmsched",
                "service.instance.id": str(uuid.uuid4()),
                "host.name": socket.gethostname(),
                "process.pid": os.getpid(),
            }
        )
        # ParentBased: a request whose caller sampled its trace (or not) is traced (or not) alike in
        # every hop; the ratio decides only for traces that start here.
        sampler = ParentBased(TraceIdRatioBased(settings.tracing_sample_ratio))
        provider = TracerProvider(resource=resource, sampler=sampler)
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(settings.tracing_endpoint)))
            )
        else:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        instrumentors: list[Instrumentor] = []
        asyncpg_instrumentor: Instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]
        for instrumentor in (AioPikaInstrumentor(), RedisInstrumentor(), asyncpg_instrumentor):
            if getattr(instrumentor, "is_instrumented_by_opentelemetry", False):
                continue  # the embedding program's own (an engine's): left to it, on and off
            # skip_dep_check: the versions are pinned by the `tracing` extra; the check walks every
            # installed distribution's metadata, slow at start and no safer.
            instrumentor.instrument(tracer_provider=provider, skip_dep_check=True)
            instrumentors.append(instrumentor)
        return cls(provider, name, instrumentors)

    def shutdown(self) -> None:
        """Leave the tracing; the last to leave turns its instrumentations off and sends what is left."""
        self._users -= 1
        if self._users > 0:
            return
        for instrumentor in self._instrumentors:
            instrumentor.uninstrument()
        if Tracing.current is self:
            Tracing.current = None
            TRACE_IDS.source = None
        self.provider.shutdown()

    def current_ids(self) -> tuple[str, str] | None:
        """The current span's trace and span ids in hex (as tracing UIs show them), None outside any span."""
        ctx = self._trace.get_current_span().get_span_context()
        if not ctx.is_valid:
            return None
        return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")

    def kind(self, kind: Kind) -> SpanKind:
        return getattr(self._trace.SpanKind, kind.upper())  # type: ignore[no-any-return]


# ---------------------------------------------------------------- what the hops call
def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, kind: Kind = "internal"
) -> AbstractContextManager[Any]:
    """A span around a block, a child of the current one (the shared no-op while tracing is off)."""
    running = Tracing.current
    if running is None:
        return _NO_SPAN
    return running.tracer.start_as_current_span(name, attributes=attributes, kind=running.kind(kind))


def current_span() -> Span | None:
    """The span current here (None while tracing is off): for a span begun elsewhere to parent on or link to."""
    running = Tracing.current
    if running is None:
        return None
    current: Span = running._trace.get_current_span()
    return current


def group_span(
    name: str, parent: Span | None, attributes: Mapping[str, Any] | None = None
) -> AbstractContextManager[Any]:
    """A span for work done for several requests at once, a child of `parent` (one request's span)
    wherever it runs; `link_members` links it to the others once they are known."""
    running = Tracing.current
    if running is None:
        return _NO_SPAN
    ctx = running._trace.set_span_in_context(parent) if parent is not None else None
    return running.tracer.start_as_current_span(name, context=ctx, attributes=attributes)


def link_members(group: Span | None, members: Sequence[Span | None]) -> None:
    """Link `group` (a group_span) to each member's span, and each member's span back to it: each
    request's trace shows where its group was decided, the group's shows whom it decided."""
    if group is None or Tracing.current is None:
        return
    mine = group.get_span_context()
    for member in members:
        if member is None:
            continue
        theirs = member.get_span_context()
        if theirs.is_valid and theirs != mine:
            group.add_link(theirs)
            if member.is_recording():
                member.add_link(mine)


def inject(headers: MutableMapping[str, Any]) -> None:
    """Put the current span in `headers` (W3C traceparent), for a bus the instrumentation does not see."""
    running = Tracing.current
    if running is not None:
        running._propagate.inject(headers)


def extracted(headers: Mapping[str, Any]) -> AbstractContextManager[Any]:
    """Run the block in the trace `headers` carry (see `inject`); as it is while tracing is off."""
    running = Tracing.current
    if running is None:
        return _NO_SPAN
    return _attached(running, headers)


@contextlib.contextmanager
def _attached(running: Tracing, headers: Mapping[str, Any]) -> Iterator[None]:
    token = running._context.attach(running._propagate.extract(headers))
    try:
        yield
    finally:
        running._context.detach(token)


__all__ = ["Tracing", "current_span", "extracted", "group_span", "inject", "link_members", "span", "traces_url"]
