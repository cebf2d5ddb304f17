# One image for every vmsched service; deploy/compose.yml picks the service with
# `command: ["run", "<service>"]` (or `["db", "migrate"]` for the one-shot migration).
# Health checks are set per service in compose: each service serves /readyz (and /metrics) on
# VMSCHED_METRICS_PORT, which the check fetches with the stdlib (no curl in the slim image).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# Numeric uid/gid so Kubernetes `runAsNonRoot` can verify the user without reading /etc/passwd.
RUN groupadd --system --gid 10001 vmsched \
    && useradd --system --uid 10001 --gid vmsched --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin vmsched

WORKDIR /src
COPY pyproject.toml README.md ./
COPY libs/ libs/
COPY services/ services/
# A regular (non-editable) install: the packages and their data (SQL migrations) go into
# site-packages, so the image does not depend on /src at run time.
# With the tracing extra: OpenTelemetry stays off (nothing of it imported by vmsched) unless
# VMSCHED_TRACING_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set.
RUN pip install --no-cache-dir ".[tracing]" \
    && rm -rf /src/build /src/*.egg-info

WORKDIR /tmp
USER 10001:10001

ENTRYPOINT ["vmsched"]
CMD ["--help"]
