"""The api's tokens, roles, error map and body cap, on the app with no service behind it (a memory
bus nobody serves: every call that reaches the bus is answered 503 naming the service to start)."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from vmsched.bus import MemoryBroker, MemoryBus
from vmsched.client import SchedulerClient
from vmsched.errors import (
    BusUnavailable,
    InvalidRequest,
    NoConsumer,
    NotAuthorized,
    PolicyStoreUnavailable,
    RemoteError,
    UsageError,
)
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched_services.api.app import create_app
from vmsched_services.api.auth import Role, TokenBook, TokenEntry, add_token, digest, entry_line, parse_tokens
from vmsched_services.api.deps import Clients
from vmsched_services.api.error_map import of_vmsched_error, policy_problems, service_of

TOKENS = {"viewer": "tv-secret", "operator": "to-secret", "admin": "ta-secret"}
BOOK = TokenBook([TokenEntry(f"{role}-user", Role.parse(role), digest(t)) for role, t in TOKENS.items()])


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


@pytest.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(api_max_body_bytes=2048)
    bus = MemoryBus(settings, MemoryBroker(), service="api")
    await bus.start()
    app = create_app(
        settings, clients=Clients(SchedulerClient(settings, bus=bus), PolicyClient(settings, bus=bus)), tokens=BOOK
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        yield client
    await bus.close()


# ------------------------------------------------------------------ the tokens file
def test_a_tokens_file_is_read_line_by_line_skipping_comments() -> None:
    text = "# tokens\n\n" + entry_line("alice", Role.ADMIN, "a") + "\n  " + entry_line("bob", Role.VIEWER, "b") + "\n"
    entries = parse_tokens(text)
    assert [(e.name, e.role) for e in entries] == [("alice", Role.ADMIN), ("bob", Role.VIEWER)]
    assert entries[0].digest == digest("a")
    assert "sha256:" in text
    assert "a\n" not in text.split("sha256:")[1]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("alice admin", "expected 3 fields"),
        ("alice root sha256:" + "0" * 64, "unknown role"),
        ("alice admin md5:abc", "sha256:<64 hex digits>"),
        ("al ice admin sha256:" + "0" * 64, "expected 3 fields"),
        ("-x admin sha256:" + "0" * 64, "not a token name"),
    ],
)
def test_a_wrong_line_is_refused_naming_its_line(line: str, says: str) -> None:
    with pytest.raises(UsageError, match=says) as caught:
        parse_tokens("# first\n" + line)
    assert "line 2" in str(caught.value)


def test_a_name_listed_twice_is_refused() -> None:
    with pytest.raises(UsageError, match="listed twice"):
        parse_tokens(entry_line("a", Role.ADMIN, "x") + "\n" + entry_line("a", Role.VIEWER, "y"))


def test_token_add_appends_a_hash_and_returns_the_token_once(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    token = add_token(path, "alice", Role.ADMIN)
    second = add_token(path, "bob", Role.OPERATOR)
    assert token.startswith("vms_")
    assert token != second
    assert token not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    book = TokenBook.from_text(path.read_text())
    found = book.find(token)
    assert found is not None
    assert (found.name, found.role) == ("alice", Role.ADMIN)
    with pytest.raises(UsageError, match="already has a token named alice"):
        add_token(path, "alice", Role.VIEWER)


def test_roles_are_ordered_viewer_operator_admin() -> None:
    assert Role.VIEWER < Role.OPERATOR < Role.ADMIN
    assert Role.parse(" Admin ") is Role.ADMIN


def test_a_token_is_compared_in_constant_time_with_every_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counted(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counted)
    found = BOOK.find(TOKENS["viewer"])  # the first entry: the others are compared all the same
    assert found is not None
    assert found.name == "viewer-user"
    assert len(calls) == len(BOOK.entries)
    assert BOOK.find("nope") is None


# ------------------------------------------------------------------ the error map
@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (InvalidRequest("bad", location="body.x"), 422, "invalid_request"),
        (RemoteError("invalid_policy", "nothing was stored; 1 problem(s):\n  - policy p: no unit X"), 422, None),
        (RemoteError("policy_not_found", "no policy 'x'"), 404, None),
        (RemoteError("unknown_cluster", "no state"), 404, None),
        (RemoteError("policy_locked", "built in"), 409, None),
        (RemoteError("policy_in_use", "attached"), 409, None),
        (RemoteError("not_authorized", "not an admin"), 403, None),
        (NotAuthorized("no"), 403, "not_authorized"),
        (RemoteError("policy_store_unavailable", "PostgreSQL away"), 503, None),
        (PolicyStoreUnavailable("away"), 503, "policy_store_unavailable"),
        (BusUnavailable("RabbitMQ away"), 503, "bus_unavailable"),
        (NoConsumer("no service serves 'policy.read': the request was unroutable"), 503, "no_consumer"),
        (RemoteError("internal", "internal error (reference abc)"), 502, None),
    ],
)
def test_errors_map_to_statuses(exc: Exception, status: int, code: str | None) -> None:
    assert isinstance(exc, InvalidRequest | RemoteError | NotAuthorized | BusUnavailable | NoConsumer | Exception)
    got, body = of_vmsched_error(exc)  # type: ignore[arg-type]
    assert got == status
    expected = code or (exc.remote_code if isinstance(exc, RemoteError) else "")
    assert body["error"]["code"] == expected


def test_no_consumer_names_the_service_to_start() -> None:
    assert service_of("no service serves 'policy.read': the request was unroutable") == "policy-admin"
    assert service_of("no service is consuming x (route 'state')") == "state-tracker"
    _, body = of_vmsched_error(NoConsumer("no service serves 'schedule'"))
    assert "vmsched run selector" in body["error"]["hint"]


def test_an_invalid_policy_lists_every_problem_with_its_location() -> None:
    message = "nothing was stored; 2 problem(s):\n  - policy p: unknown unit Memry (did you mean Memory?)\n  - x"
    assert policy_problems(message) == [
        {"location": "policy p", "message": "unknown unit Memry (did you mean Memory?)"},
        {"location": "", "message": "x"},
    ]


# ------------------------------------------------------------------ over HTTP, no service behind
async def test_healthz_needs_no_token(api: httpx.AsyncClient) -> None:
    r = await api.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    assert r.headers["x-request-id"]


async def test_no_token_is_401_and_a_bad_one_too(api: httpx.AsyncClient) -> None:
    r = await api.get("/api/v1/whoami")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "not_authenticated"
    r = await api.get("/api/v1/whoami", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert "not one this api knows" in r.json()["error"]["message"]


async def test_without_a_tokens_file_every_request_is_401_naming_the_setting() -> None:
    app = create_app(Settings(), tokens=TokenBook([]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        r = await client.get("/api/v1/whoami", headers=bearer("admin"))
    assert r.status_code == 401
    assert "VMSCHED_API_TOKENS_FILE" in r.json()["error"]["hint"]


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
async def test_whoami_names_the_token_and_its_role(api: httpx.AsyncClient, role: str) -> None:
    r = await api.get("/api/v1/whoami", headers=bearer(role))
    assert (r.status_code, r.json()) == (200, {"name": f"{role}-user", "role": role})


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("operator", 403), ("admin", 503)])
async def test_a_policy_write_needs_an_admin(api: httpx.AsyncClient, role: str, status: int) -> None:
    r = await api.delete("/api/v1/schedulingpolicies/mine", headers=bearer(role))
    assert r.status_code == status, r.text
    if status == 403:
        assert "needs admin" in r.json()["error"]["message"]


async def test_a_service_not_running_is_503_with_a_hint_and_no_traceback(api: httpx.AsyncClient) -> None:
    r = await api.get("/api/v1/schedulingpolicies", headers=bearer("viewer"))
    assert r.status_code == 503
    assert r.headers["retry-after"]
    error = r.json()["error"]
    assert error["code"] == "no_consumer"
    assert "vmsched run policy-admin" in error["hint"]
    assert "Traceback" not in r.text


async def test_the_session_cookie_authenticates_and_unsafe_methods_need_the_console_header(
    api: httpx.AsyncClient,
) -> None:
    api.cookies.set("vmsched_session", TOKENS["admin"])
    r = await api.get("/api/v1/whoami")
    assert r.json() == {"name": "admin-user", "role": "admin"}
    r = await api.delete("/api/v1/schedulingpolicies/mine")
    assert r.status_code == 403
    assert "X-Vmsched-Console" in r.json()["error"]["message"]
    r = await api.delete("/api/v1/schedulingpolicies/mine", headers={"X-Vmsched-Console": "1"})
    assert r.status_code == 503  # past authentication: nothing serves policy.delete here
    api.cookies.clear()


async def test_an_oversize_body_is_413_unread(api: httpx.AsyncClient) -> None:
    body = {"description": "x" * 5000}
    r = await api.put("/api/v1/schedulingpolicies/mine", json=body, headers=bearer("admin"))
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert "VMSCHED_API_MAX_BODY_BYTES" in r.json()["error"]["message"]


async def test_a_chunked_oversize_body_is_413_too(api: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    r = await api.put("/api/v1/schedulingpolicies/mine", content=chunks(), headers=bearer("admin"))
    assert r.status_code == 413


async def test_malformed_json_is_422_with_its_location(api: httpx.AsyncClient) -> None:
    r = await api.post(
        "/api/v1/schedulingpolicies/mine/validate",
        content=b'{"filters": [',
        headers={**bearer("viewer"), "Content-Type": "application/json"},
    )
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["location"].startswith("body")
    r = await api.post(
        "/api/v1/schedulingpolicies/mine/validate",
        json={"weights": [{"unit": "X", "factor": "big"}]},
        headers=bearer("viewer"),
    )
    assert r.status_code == 422
    assert r.json()["error"]["errors"][0]["location"] == "body.weights.0.factor"


async def test_an_unknown_path_is_404_in_the_error_form(api: httpx.AsyncClient) -> None:
    r = await api.get("/api/v1/nothing-here", headers=bearer("viewer"))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
