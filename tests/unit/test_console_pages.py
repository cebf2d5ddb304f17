"""The console's pages and assets as the server sends them: no browser, no services.

Checks what must hold whatever the data: pages need a session (to the login page otherwise, and
back afterwards, never to another site), assets are the console's own files with their types and
nothing is loaded from elsewhere, data is escaped, the scripts never parse data as HTML.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from vmsched.settings import Settings
from vmsched_services.api import console
from vmsched_services.api.app import create_app
from vmsched_services.api.auth import Role, TokenBook, entry_line
from vmsched_services.api.console.pages import environment, safe_next

PACKAGE = Path(console.__file__).parent
STATIC = PACKAGE / "static"
TEMPLATES = PACKAGE / "templates"
PAGES = [
    "/console/clusters",
    "/console/clusters/c1",
    "/console/clusters/c1/decisions/0b7e0d4e-4a39-4bd4-9d0c-0d3bb8b4a7a1",
    "/console/policies",
    "/console/policies/none",
    "/console/whatif",
    "/console/simulation",
]


TOKEN = "vms_console-unit-test-token"


@pytest.fixture
def http() -> TestClient:
    """The api's app with one viewer token and no bus (its lifespan does not run: no clients), so
    pages render without their initial data, as when the services are away."""
    app = create_app(Settings(), tokens=TokenBook.from_text(entry_line("ann", Role.VIEWER, TOKEN)))
    return TestClient(app, follow_redirects=False)


def login(http: TestClient, token: str = TOKEN) -> httpx.Response:
    response: httpx.Response = http.post(
        "/console/login",
        content=f"token={token}&next=%2Fconsole%2Fpolicies".encode(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    return response


@pytest.mark.parametrize("path", PAGES)
def test_a_page_without_a_session_goes_to_the_login_page_and_back(http: TestClient, path: str) -> None:
    r = http.get(path, params={"x": "1"})
    assert r.status_code == 303
    assert r.headers["location"].startswith("/console/login?next=")
    assert path.replace("/", "%2F") in r.headers["location"]


def test_the_login_page_asks_for_a_token_and_posts_to_the_console(http: TestClient) -> None:
    r = http.get("/console/login", params={"next": "/console/policies"})
    assert r.status_code == 200
    assert 'name="token"' in r.text
    assert 'type="password"' in r.text
    assert '<label for="token">' in r.text
    assert 'value="/console/policies"' in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/x", "/api/v1/whoami", "/console\\..\\x", ""]
)
def test_after_signing_in_the_console_goes_only_to_its_own_pages(target: str) -> None:
    assert safe_next(target) == "/console/clusters"
    assert safe_next("/console/policies/x?y=1") == "/console/policies/x?y=1"


def test_an_empty_token_is_refused_with_a_sentence(http: TestClient) -> None:
    r = http.post("/console/login", content=b"token=&next=%2Fconsole%2Fpolicies",
                  headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert r.status_code == 200
    assert "Paste an API token" in r.text
    assert "vmsched_session" not in r.headers.get("set-cookie", "")


def test_a_login_posted_from_another_site_is_refused(http: TestClient) -> None:
    r = http.post("/console/login", content=b"token=t", headers={
        "content-type": "application/x-www-form-urlencoded", "origin": "https://evil.example"})  # fmt: skip
    assert "vmsched_session" not in r.headers.get("set-cookie", "")
    assert "must be sent from the console" in r.text


def test_a_valid_token_becomes_the_session_cookie_and_opens_the_pages(http: TestClient) -> None:
    r = login(http)
    assert r.status_code == 303
    assert r.headers["location"] == "/console/policies"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"vmsched_session={TOKEN};")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/" in cookie
    http.cookies.set("vmsched_session", TOKEN)
    for path in PAGES:
        page = http.get(path)
        assert page.status_code == 200, path
        assert "ann · viewer" in page.text
        assert "Sign out" in page.text
        assert "Traceback" not in page.text


def test_a_wrong_token_is_refused_and_a_stale_cookie_sends_to_the_login_page(http: TestClient) -> None:
    r = login(http, "vms_wrong")
    assert r.status_code == 200
    assert "not valid" in r.text
    assert "vmsched_session" not in r.headers.get("set-cookie", "")
    http.cookies.set("vmsched_session", "vms_wrong")
    page = http.get("/console/policies")
    assert page.status_code == 303
    assert page.headers["location"].startswith("/console/login")
    assert 'vmsched_session=""' in page.headers["set-cookie"]


def test_sign_out_forgets_the_session(http: TestClient) -> None:
    r = http.post("/console/logout")
    assert r.status_code == 303
    assert r.headers["location"] == "/console/login"
    assert 'vmsched_session=""' in r.headers["set-cookie"]
    assert "Max-Age=0" in r.headers["set-cookie"]


@pytest.mark.parametrize("name", sorted(p.name for p in STATIC.iterdir()))
def test_every_asset_is_served_with_its_type(http: TestClient, name: str) -> None:
    r = http.get(f"/console/static/{name}")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith({"js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]])
    assert r.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("name", ["nope.js", "..%2F__init__.py", "__init__.py", "%2Fetc%2Fpasswd"])
def test_nothing_else_is_served_as_an_asset(http: TestClient, name: str) -> None:
    assert http.get(f"/console/static/{name}").status_code == 404


def _sources() -> list[Path]:
    return sorted([*STATIC.iterdir(), *TEMPLATES.iterdir()])


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.name)
def test_nothing_is_loaded_from_another_site(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", text), path
    assert not re.search(r"""@import|url\(\s*["']?(https?:)?//""", text), path
    assert "cdn" not in text.lower(), path


@pytest.mark.parametrize("path", sorted(STATIC.glob("*.js")), ids=lambda p: p.name)
def test_scripts_never_parse_data_as_html(path: Path) -> None:
    text = path.read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in text, f"{path.name} uses {sink}"


def test_templates_escape_data_even_in_the_embedded_json() -> None:
    hostile = "</script><script>alert(1)</script>"
    page = (
        environment()
        .get_template("cluster.html")
        .render(
            title=hostile,
            nav="clusters",
            who={"name": hostile, "role": "viewer"},
            params={"cluster_id": hostile},
            page="cluster",
            initial={"params": {"cluster_id": hostile}, "data": None},
            problem={"message": hostile, "hint": ""},
        )
    )
    assert "<script>alert(1)</script>" not in page
    assert page.count("<script") == page.count("</script>")
    assert "&lt;/script&gt;" in page  # the text, escaped
    assert "\\u003c/script\\u003e" in page  # the JSON, escaped


def test_every_page_has_one_h1_and_labelled_controls() -> None:
    """Accessible basics: one heading per page, and every input, select and textarea labelled."""
    for path in TEMPLATES.glob("*.html"):
        text = path.read_text()
        if path.name == "base.html":
            assert 'lang="en"' in text
            assert 'id="main"' in text
            continue
        assert text.count("<h1") == 1, path.name
        for control in re.finditer(r"<(input|select|textarea)\b([^>]*)>", text):
            attrs = control.group(2)
            if 'type="hidden"' in attrs or ('type="checkbox"' in attrs and "<label" in text):
                continue
            ident = re.search(r'id="([^"]+)"', attrs)
            assert ident, (path.name, attrs)
            assert f'for="{ident.group(1)}"' in text or "aria-label" in attrs, (path.name, attrs)


def test_every_console_file_is_in_the_package_data_a_regular_install_takes() -> None:
    pyproject = tomllib.loads((PACKAGE.parents[3] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["vmsched_services"]
    services = PACKAGE.parents[1]
    files = [p.relative_to(services).as_posix() for d in (STATIC, TEMPLATES) for p in d.rglob("*") if p.is_file()]
    assert files
    assert [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)] == []
