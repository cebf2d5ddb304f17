"""Settings from files (VMSCHED_<NAME>_FILE, as Docker and Kubernetes mount secrets), and Settings
that never show a credential in their repr."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsched.errors import SettingsFileError
from vmsched.health import MetricsServers
from vmsched.logging import SECRETS
from vmsched.settings import Settings, VariableFileSource, redacted_url, url_passwords
from vmsched_services.tools.cli import main
from vmsched_services.tools.clikit import EXIT_USAGE, settings
from vmsched_services.tools.servers.base import free_port

PASSWORD = "s3cret-unit-Xq7"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No VMSCHED_* from the machine's environment, and the secret registry left as found."""
    for name in [k for k in os.environ if k.upper().startswith("VMSCHED_")]:
        monkeypatch.delenv(name)
    yield monkeypatch
    SECRETS.clear()


def secret_file(tmp_path: Path, text: str, name: str = "secret") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_setting_is_read_from_its_file_less_the_trailing_newline(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    url = f"amqp://vmsched:{PASSWORD}@rabbit:5672/"
    env.setenv("VMSCHED_AMQP_URL_FILE", str(secret_file(tmp_path, url + "\n")))
    env.setenv("VMSCHED_REDIS_SENTINEL_PASSWORD_FILE", str(secret_file(tmp_path, f" {PASSWORD} \r\n", "s")))
    env.setenv("VMSCHED_METRICS_PORT_FILE", str(secret_file(tmp_path, "9100\n", "port")))
    s = Settings()
    assert s.amqp_url == url
    assert s.redis_sentinel_password == f" {PASSWORD} "  # only the line end is not part of the value
    assert s.metrics_port == 9100  # any setting, validated as from its variable


def test_without_files_the_environment_and_defaults_apply(env: pytest.MonkeyPatch) -> None:
    env.setenv("VMSCHED_REDIS_URL", "redis://r:6379/1")
    s = Settings()
    assert (s.redis_url, s.postgres_url) == ("redis://r:6379/1", Settings.model_fields["postgres_url"].default)


def test_a_setting_given_both_ways_is_refused_naming_both_variables(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("VMSCHED_POSTGRES_URL", "postgresql://a@b/c")
    env.setenv("VMSCHED_POSTGRES_URL_FILE", str(secret_file(tmp_path, PASSWORD)))
    with pytest.raises(SettingsFileError) as caught:
        Settings()
    assert "VMSCHED_POSTGRES_URL and VMSCHED_POSTGRES_URL_FILE" in str(caught.value)


def test_an_unreadable_file_is_refused_naming_the_variable_and_path(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    env.setenv("VMSCHED_REDIS_URL_FILE", str(missing))
    with pytest.raises(SettingsFileError, match=f"VMSCHED_REDIS_URL_FILE: cannot read {missing}: No such file"):
        Settings()
    env.setenv("VMSCHED_REDIS_URL_FILE", str(tmp_path))
    with pytest.raises(SettingsFileError, match="Is a directory"):
        Settings()


def test_a_file_that_is_not_text_is_refused_without_quoting_it(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "binary"
    path.write_bytes(b"\xffpassword\xfe")
    env.setenv("VMSCHED_REDIS_SENTINEL_PASSWORD_FILE", str(path))
    with pytest.raises(SettingsFileError) as caught:
        Settings()
    assert str(caught.value) == f"VMSCHED_REDIS_SENTINEL_PASSWORD_FILE: {path} is not UTF-8 text"


def test_the_source_matches_variables_without_regard_to_case(tmp_path: Path) -> None:
    source = VariableFileSource(Settings, {"vmsched_redis_url_file": str(secret_file(tmp_path, "redis://x/0"))})
    assert source() == {"redis_url": "redis://x/0"}


def test_the_command_says_which_file_it_cannot_read(
    env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("VMSCHED_AMQP_URL_FILE", str(tmp_path / "gone"))
    assert main(["policy", "list"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"VMSCHED_AMQP_URL_FILE: cannot read {tmp_path / 'gone'}" in err
    assert "Traceback" not in err


def test_settings_from_the_command_register_their_secrets(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("VMSCHED_REDIS_URL_FILE", str(secret_file(tmp_path, f"redis://:{PASSWORD}@r:6379/0\n")))
    settings()
    assert SECRETS.mask(f"auth {PASSWORD} failed") == "auth *** failed"


def test_repr_and_str_show_no_credential(env: pytest.MonkeyPatch) -> None:
    s = Settings(
        amqp_url=f"amqp://vmsched:{PASSWORD}@rabbit:5672/",
        amqp_failover_urls=f"amqp://vmsched:{PASSWORD}@rabbit-2:5672/,amqp://other:x%40y@rabbit-3/",
        redis_url=f"redis://:{PASSWORD}@redis:6379/0",
        postgres_url=f"postgresql://vmsched@pg:5432/vmsched?password={PASSWORD}",
        redis_sentinel_password=PASSWORD,
    )
    for text in (repr(s), str(s), f"{s!r}"):
        assert PASSWORD not in text
        assert "x%40y" not in text
        assert "amqp://vmsched:***@rabbit:5672/" in text
        assert "amqp://other:***@rabbit-3/" in text
        assert "redis://:***@redis:6379/0" in text
        assert "postgresql://vmsched@pg:5432/vmsched?password=***" in text
        assert "redis_sentinel_password='***'" in text
    assert s.redis_url == f"redis://:{PASSWORD}@redis:6379/0"  # the values themselves are untouched


def test_secret_values_are_the_configured_credentials_not_the_defaults() -> None:
    assert Settings.model_construct().secret_values() == frozenset()  # guest's password is public
    s = Settings(
        amqp_url="amqp://u:p%40ss@h/", postgres_url="postgresql://u@h/d?password=pg-pw", redis_sentinel_password="sp"
    )
    assert s.secret_values() == {"p%40ss", "p@ss", "pg-pw", "sp"}


def test_url_passwords_and_redaction_of_odd_urls() -> None:
    assert url_passwords("redis://h/0,amqp://u@h/") == set()
    assert redacted_url("redis://h/0") == "redis://h/0"
    assert redacted_url("http://[::1") == "***"  # unparsable: it could be anything
    assert url_passwords("http://[::1") == {"http://[::1"}


def test_the_metrics_endpoint_listens_on_loopback_unless_told(env: pytest.MonkeyPatch) -> None:
    assert Settings().metrics_host == "127.0.0.1"
    env.setenv("VMSCHED_METRICS_HOST", "0.0.0.0")
    assert Settings().metrics_host == "0.0.0.0"
    servers = MetricsServers()
    try:
        servers.serve(free_port())
        servers.serve(free_port(), host="0.0.0.0")
        assert sorted(s.server_address[0] for s in servers._by_port.values()) == ["0.0.0.0", "127.0.0.1"]
    finally:
        servers.reset()
