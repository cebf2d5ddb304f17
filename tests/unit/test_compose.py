"""The container deployment: deploy/compose.yml and the one Dockerfile all services share.

Static checks with PyYAML, so they run anywhere; `docker compose config` runs too where the
compose plugin is installed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

import vmsched_services

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

APP_SERVICES = ("state-tracker", "filter-worker", "weigher", "selector", "balancer", "ha-monitor", "policy-admin")
REPLICATED = ("filter-worker", "weigher", "state-tracker")
INFRA_SERVICES = ("rabbitmq", "redis", "postgres")
#: Each service reads its URLs (with its role's generated password) from its credentials directory.
EXPECTED_URL_FILES = {
    "VMSCHED_AMQP_URL_FILE": "/run/vmsched/amqp_url",
    "VMSCHED_REDIS_URL_FILE": "/run/vmsched/redis_url",
    "VMSCHED_POSTGRES_URL_FILE": "/run/vmsched/postgres_url",
}


# ---------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    assert isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return cast(dict[str, dict[str, Any]], compose["services"])


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, args = line.partition(" ")
        out.append((instr.upper(), args.strip()))
    return out


def _exec_form(value: str | list[str]) -> list[str]:
    """Argv of a Dockerfile/compose command in exec form (JSON list) or shell form (string)."""
    if isinstance(value, list):
        return [str(v) for v in value]
    value = value.strip()
    if value.startswith("["):
        return [str(v) for v in json.loads(value)]
    return shlex.split(value)


def _image_entrypoint() -> list[str]:
    entrypoints = [args for instr, args in _dockerfile_instructions() if instr == "ENTRYPOINT"]
    assert entrypoints, "Dockerfile has no ENTRYPOINT"
    return _exec_form(entrypoints[-1])


def _argv(service: dict[str, Any]) -> list[str]:
    """What the container runs: the service's entrypoint (or the image's) followed by its command."""
    entrypoint = _exec_form(service["entrypoint"]) if "entrypoint" in service else _image_entrypoint()
    return entrypoint + _exec_form(service.get("command", []))


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # ["KEY=value", ...]
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    """depends_on as {service: condition}; the short list form means service_started."""
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def _healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    return _exec_form(test)


# ---------------------------------------------------------------- application services
@pytest.mark.parametrize("name", APP_SERVICES)
def test_service_runs_its_own_command(services: dict[str, dict[str, Any]], name: str) -> None:
    assert name in services
    assert _argv(services[name]) == ["vmsched", "run", name]


def test_all_services_share_one_build(services: dict[str, dict[str, Any]]) -> None:
    built = {name: svc for name, svc in services.items() if "build" in svc}
    assert set(APP_SERVICES) | {"migrate"} <= set(built)
    builds = {json.dumps(svc["build"], sort_keys=True) for svc in built.values()}
    assert len(builds) == 1, f"services are built differently: {builds}"
    build = next(iter(built.values()))["build"]
    assert isinstance(build, dict)
    assert build["context"] == ".."
    assert build.get("dockerfile", "Dockerfile") == "Dockerfile"
    assert (COMPOSE_FILE.parent / build["context"]).resolve() / "Dockerfile" == DOCKERFILE
    # One image tag too, so compose does not build a differently named copy per service.
    assert len({svc.get("image") for svc in built.values()}) == 1


@pytest.mark.parametrize("name", APP_SERVICES)
def test_service_reads_its_urls_from_its_own_credentials(services: dict[str, dict[str, Any]], name: str) -> None:
    env = _environment(services[name])
    for key, path in EXPECTED_URL_FILES.items():
        assert env.get(key) == path, f"{name}: {key}"
        assert key.removesuffix("_FILE") not in env, f"{name}: {key} and its URL both set"
    assert env.get("VMSCHED_AMQP_DECLARE") == "false"
    assert env.get("VMSCHED_METRICS_PORT") == "9100"
    # Its own role's directory of the credentials volume only, read-only.
    mounts = [v for v in services[name].get("volumes", []) if isinstance(v, dict) and v["source"] == "credentials"]
    assert len(mounts) == 1, name
    assert mounts[0]["target"] == "/run/vmsched"
    assert mounts[0]["read_only"] is True
    assert mounts[0]["volume"]["subpath"] == name


def test_no_credential_is_written_in_the_compose_file() -> None:
    text = COMPOSE_FILE.read_text()
    assert "guest" not in text
    assert "trust" not in text
    # A URL with a password in it: scheme://user:password@
    assert not re.search(r"[a-z]+://[^/\s:@]+:[^/\s@]+@", text)


def test_credentials_are_generated_before_anything_starts(services: dict[str, dict[str, Any]]) -> None:
    command = " ".join(_exec_form(services["credentials"]["command"]))
    assert "vmsched security init /credentials" in command
    for name in (*INFRA_SERVICES, *APP_SERVICES):
        deps = _depends_on(services[name])
        assert deps.get("credentials") == "service_completed_successfully", name


def test_servers_take_their_users_from_the_credentials(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert "load_definitions = /etc/vmsched/definitions.json" in compose["configs"]["rabbitmq-vmsched"]["content"]
    argv = _exec_form(services["redis"]["command"])
    assert argv[argv.index("--aclfile") + 1] == "/etc/vmsched/users.acl"
    env = _environment(services["postgres"])
    assert env["POSTGRES_PASSWORD_FILE"] == "/etc/vmsched/owner_password"
    assert env["POSTGRES_HOST_AUTH_METHOD"] == "scram-sha-256"
    assert "vmsched security apply /credentials --postgres" in " ".join(_exec_form(services["migrate"]["command"]))


@pytest.mark.parametrize("name", APP_SERVICES)
def test_service_healthcheck_fetches_readiness(services: dict[str, dict[str, Any]], name: str) -> None:
    svc = services[name]
    assert "healthcheck" in svc, name
    argv = _healthcheck_argv(svc)
    assert argv[0] in ("CMD", "CMD-SHELL")
    command = " ".join(argv[1:])
    assert "urllib" in command
    port = _environment(svc)["VMSCHED_METRICS_PORT"]
    # urlopen raises on /readyz's 503: the container is healthy once its bus, Redis (and PostgreSQL) answer.
    assert f"http://127.0.0.1:{port}/readyz" in command


@pytest.mark.parametrize("name", APP_SERVICES)
def test_service_waits_for_infrastructure_and_migration(services: dict[str, dict[str, Any]], name: str) -> None:
    deps = _depends_on(services[name])
    assert deps.get("rabbitmq") == "service_healthy"
    assert deps.get("redis") == "service_healthy"
    assert deps.get("migrate") == "service_completed_successfully"
    if name == "selector":
        assert deps.get("postgres") == "service_healthy"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_service_restarts(services: dict[str, dict[str, Any]], name: str) -> None:
    assert services[name].get("restart") == "unless-stopped"


@pytest.mark.parametrize("name", REPLICATED)
def test_stateless_workers_are_replicated(services: dict[str, dict[str, Any]], name: str) -> None:
    assert services[name].get("deploy", {}).get("replicas", 1) > 1


def test_replicated_services_publish_no_host_ports(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if svc.get("deploy", {}).get("replicas", 1) > 1:
            assert not svc.get("ports"), f"{name} has replicas and publishes host ports (they would clash)"


def test_service_names_are_known_to_the_cli(services: dict[str, dict[str, Any]]) -> None:
    known = getattr(vmsched_services, "SERVICES", None)
    if known is None:
        pytest.skip("vmsched_services.SERVICES does not exist yet")
    for name, svc in services.items():
        argv = _argv(svc) if "build" in svc else []
        if argv[:2] == ["vmsched", "run"]:
            assert argv[2] in known, f"{name}: `vmsched run {argv[2]}` is not in vmsched_services.SERVICES"


# ---------------------------------------------------------------- migration and infrastructure
def test_migrate_is_one_shot(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert _argv(migrate)[:2] == ["sh", "-c"]
    assert _argv(migrate)[2].startswith("vmsched db migrate && ")
    assert str(migrate.get("restart")) == "no"
    assert _depends_on(migrate).get("postgres") == "service_healthy"
    assert _environment(migrate).get("VMSCHED_POSTGRES_URL_FILE") == "/credentials/ops/postgres_url"


def test_rabbitmq_has_management(services: dict[str, dict[str, Any]]) -> None:
    rabbit = services["rabbitmq"]
    assert rabbit["image"].startswith("rabbitmq:")
    assert "management" in rabbit["image"]
    published = {str(p).rsplit(":", 1)[-1] for p in rabbit.get("ports", [])}
    # AMQP for the engine, on the host's loopback unless told otherwise; never the management UI.
    assert published == {"5672"}
    assert rabbit["ports"] == ["${VMSCHED_AMQP_PUBLISH:-127.0.0.1:5672}:5672"]


@pytest.mark.parametrize(
    ("name", "probe"),
    [("rabbitmq", "rabbitmq-diagnostics"), ("redis", "redis-cli"), ("postgres", "pg_isready")],
)
def test_infrastructure_has_healthchecks(services: dict[str, dict[str, Any]], name: str, probe: str) -> None:
    assert name in services
    assert "healthcheck" in services[name], name
    assert probe in " ".join(_healthcheck_argv(services[name]))


def test_postgres_holds_the_database_of_the_urls(services: dict[str, dict[str, Any]]) -> None:
    assert _environment(services["postgres"]).get("POSTGRES_DB") == "vmsched"


def _volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Named volumes of a service as {volume: path in the container} (short "name:/path" form)."""
    out = {}
    for v in service.get("volumes", []):
        source, target = (v["source"], v["target"]) if isinstance(v, dict) else str(v).split(":")[:2]
        out[source] = target
    return out


@pytest.mark.parametrize(
    ("name", "data_dir"),
    [("redis", "/data"), ("rabbitmq", "/var/lib/rabbitmq"), ("postgres", "/var/lib/postgresql/data")],
)
def test_every_server_keeps_its_data_on_a_named_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], name: str, data_dir: str
) -> None:
    mounts = _volume_mounts(services[name])
    assert data_dir in mounts.values(), f"{name} keeps {data_dir} in the container only: a recreate loses it"
    volume = next(v for v, path in mounts.items() if path == data_dir)
    assert volume in (compose.get("volumes") or {}), f"{name}: {volume} is not a named volume"


def test_redis_writes_an_append_only_file_fsynced_every_second(services: dict[str, dict[str, Any]]) -> None:
    argv = _exec_form(services["redis"].get("command", []))
    assert argv[:1] == ["redis-server"]
    options = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert options.get("--appendonly") == "yes"
    assert options.get("--appendfsync") == "everysec"


def test_rabbitmq_has_a_fixed_node_name(services: dict[str, dict[str, Any]]) -> None:
    # Its data directory is named after the node, which defaults to the container's hostname.
    assert services["rabbitmq"].get("hostname") == "rabbitmq"


def test_every_dependency_exists(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for dep in _depends_on(svc):
            assert dep in services, f"{name} depends on unknown service {dep!r}"


# ---------------------------------------------------------------- Dockerfile
def test_dockerfile_installs_the_project() -> None:
    instructions = _dockerfile_instructions()
    assert instructions[0][0] == "FROM"
    assert instructions[0][1].startswith("python:3.11-slim")

    copied = " ".join(args for instr, args in instructions if instr == "COPY")
    for path in ("pyproject.toml", "README.md", "libs", "services"):
        assert path in copied, f"Dockerfile does not copy {path}"

    installs = [args for instr, args in instructions if instr == "RUN" and "pip install" in args]
    assert installs, "Dockerfile never runs pip install"
    for args in installs:
        argv = shlex.split(args)
        assert "-e" not in argv, "the image must not use an editable install"
        assert "--editable" not in argv, "the image must not use an editable install"
    # The project itself (".", with extras or not: ".[tracing]"), not a copy from an index.
    assert any(re.search(r"pip install (?:\S+ )*[\"']?\.(?:\[[a-z,]+\])?[\"']?(?:\s|$)", args) for args in installs)


def test_dockerfile_runs_as_non_root() -> None:
    users = [args for instr, args in _dockerfile_instructions() if instr == "USER"]
    assert users, "Dockerfile has no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_dockerfile_entrypoint_is_vmsched() -> None:
    assert _image_entrypoint() == ["vmsched"]


def test_dockerignore_keeps_the_context_small() -> None:
    patterns = {line.strip().strip("/") for line in DOCKERIGNORE.read_text().splitlines()}
    patterns.discard("")
    for excluded in (".venv", ".git", "tests", "bench-results"):
        assert excluded in patterns, f".dockerignore does not exclude {excluded}"
    # ... without excluding what the Dockerfile copies.
    for needed in ("pyproject.toml", "README.md", "libs", "services", "*.md", "*.toml"):
        assert needed not in patterns, f".dockerignore excludes {needed}, which the image needs"


# ---------------------------------------------------------------- docker compose itself
def _compose_unavailable() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "the docker client is not installed"
    try:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker compose version` could not run: {exc}"
    if probe.returncode != 0:
        reason = (probe.stderr or probe.stdout).strip().splitlines()
        return f"`docker compose` is not available here ({reason[0] if reason else probe.returncode})"
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    reason = _compose_unavailable()
    if reason is not None:
        pytest.skip(reason)
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- the HTTP API
def test_the_api_runs_on_the_bus_alone_with_its_own_credentials(services: dict[str, dict[str, Any]]) -> None:
    api = services["api"]
    assert _argv(api) == ["vmsched", "run", "api"]
    env = _environment(api)
    assert env["VMSCHED_AMQP_URL_FILE"] == "/run/vmsched/amqp_url"
    # No Redis, no PostgreSQL: the api talks to the bus only (and its role has no user there).
    assert not {k for k in env if k.startswith(("VMSCHED_REDIS", "VMSCHED_POSTGRES"))}
    assert env["VMSCHED_API_TOKENS_FILE"] == "/run/vmsched/api_tokens"
    assert env["VMSCHED_API_HOST"] == "0.0.0.0"
    mounts = [v for v in api["volumes"] if isinstance(v, dict) and v["source"] == "credentials"]
    assert [(m["volume"]["subpath"], m["read_only"]) for m in mounts] == [("api", True)]
    deps = _depends_on(api)
    assert deps.get("rabbitmq") == "service_healthy"
    assert not {"redis", "postgres", "migrate"} & set(deps)
    assert api.get("restart") == "unless-stopped"
    assert "/readyz" in " ".join(_healthcheck_argv(api))


def test_the_api_publishes_its_port_on_the_loopback(services: dict[str, dict[str, Any]]) -> None:
    assert services["api"]["ports"] == ["${VMSCHED_API_PUBLISH:-127.0.0.1:8080}:8080"]


def test_the_api_user_administers_for_its_admin_tokens(services: dict[str, dict[str, Any]]) -> None:
    admins = _environment(services["policy-admin"])["VMSCHED_ADMIN_USERS"].split(",")
    assert "vmsched-api" in admins
    command = " ".join(_exec_form(services["credentials"]["command"]))
    assert " api;" in command  # its credentials directory is given to the services' user


def test_weighers_start_only_where_they_weigh(services: dict[str, dict[str, Any]]) -> None:
    """The filter-workers weigh while VMSCHED_PLACE_IN_WORKER is true (the default): weighers would
    idle, so they start with the profile that goes with setting it false."""
    assert services["weigher"].get("profiles") == ["split-weighing"]
    for name in APP_SERVICES:
        env = services[name]["environment"]
        assert env["VMSCHED_PLACE_IN_WORKER"] == "${VMSCHED_PLACE_IN_WORKER:-true}", name
        if name != "weigher":
            assert "profiles" not in services[name], f"{name} must start by default"
