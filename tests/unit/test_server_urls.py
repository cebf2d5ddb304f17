"""The server URLs are checked when the settings are read: scheme, host and port, naming the variable
and never the password (vmsched.settings.url_problem and the Settings validators)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vmsched.reach.tls import TlsFiles, postgres_context, postgres_sslmode
from vmsched.settings import Settings, redacted_url, url_problem


@pytest.mark.parametrize(
    ("field", "url", "says"),
    [
        ("amqp_url", "127.0.0.1:5672", "VMSCHED_AMQP_URL='127.0.0.1:5672' has no scheme: write amqp://"),
        ("amqp_url", "localhost:5672", "has no scheme"),
        ("amqp_url", "http://u:secret@h:5672/", "has the scheme http://, not amqp:// or amqps://"),
        ("amqp_url", "amqp://u:secret@:5672/", "names no host"),
        ("amqp_url", "amqp://u:secret@h:99999/", "has a bad port"),
        ("amqp_url", "amqp://u:secret@h:abc/", "has a bad port"),
        ("redis_url", "127.0.0.1:6379", "VMSCHED_REDIS_URL='127.0.0.1:6379' has no scheme: write redis://"),
        ("redis_url", "amqp://h:6379/0", "not redis:// or rediss:// or unix://"),
        ("postgres_url", "redis://h:5432/vmsched", "VMSCHED_POSTGRES_URL='redis://h:5432/vmsched' has the scheme"),
        ("amqp_failover_urls", "amqp://h1:5672/, h2:5672", "VMSCHED_AMQP_FAILOVER_URLS='h2:5672' has no scheme"),
    ],
)
def test_a_bad_server_url_is_refused_naming_the_variable(field: str, url: str, says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings.model_validate({field: url})
    assert says in str(refused.value)
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(
    ("server", "url"),
    [
        ("amqp", "amqp://guest:guest@127.0.0.1:5672/"),
        ("amqp", "amqps://u:p@broker.example:5671/vmsched"),
        ("redis", "rediss://:p@127.0.0.1:6380/0"),
        ("redis", "redis://127.0.0.1/0"),
        ("redis", "unix:///run/redis.sock"),
        ("postgres", "postgresql://vmsched@db:5432/vmsched?sslmode=verify-full"),
        ("postgres", "postgresql:///vmsched"),  # the local socket
        ("postgres", "postgresql://u@h1:5432,h2:5432/vmsched"),  # several hosts
    ],
)
def test_good_server_urls_pass(server: str, url: str) -> None:
    assert url_problem(url, server) is None


def test_a_missing_tls_file_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match=r"VMSCHED_REDIS_TLS_CA_FILE='/nonexistent/ca\.pem' is not a file"):
        Settings.model_validate({"redis_tls_ca_file": "/nonexistent/ca.pem"})


def test_passwords_are_redacted_even_in_urls_that_do_not_parse() -> None:
    assert redacted_url("amqp://u:secret@h:5672/") == "amqp://u:***@h:5672/"
    assert "secret" not in redacted_url("amqp://u:secret@h:abc/")
    assert redacted_url("redis://h/0") == "redis://h/0"


def test_postgres_tls_follows_the_sslmode_of_the_url() -> None:
    files = TlsFiles(prefix="VMSCHED_POSTGRES_TLS")
    assert postgres_sslmode("postgresql://h/db?application_name=x&sslmode=verify-ca") == "verify-ca"
    assert postgres_context("postgresql://h/db", files) is None
    assert postgres_context("postgresql://h/db?sslmode=prefer", files) is None
    full = postgres_context("postgresql://h/db?sslmode=require", files)
    assert full is not None
    assert full.check_hostname
    ca_only = postgres_context("postgresql://h/db?sslmode=verify-ca", files)
    assert ca_only is not None
    assert not ca_only.check_hostname
