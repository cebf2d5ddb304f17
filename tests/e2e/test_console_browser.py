"""The web console in a real browser (Debian's chromium, headless, driven by playwright) against the
real services: state-tracker, filter-worker, weigher, selector, ha-monitor, policy-admin and the api
(uvicorn on a free loopback port, with a tokens file this test writes), in this process.

One walk through the console, as a user would: sign in with a token; the clusters page lists the
test's cluster; a built-in policy is cloned, attached to the cluster and edited in the policy editor
(an invalid property is flagged next to its field as it is typed, the diff is previewed, applied);
with the cluster page open, a VM scheduled through the API appears in its latest decisions without
a reload, and was decided by the edited policy's new version; its decision page answers "why not"
for a host a filter removed; what-if and simulation pages run. Every page must load without a
console error or an uncaught exception. A screenshot of each page is saved under
bench-results/screenshots/ (not committed), and the path printed.

Skips, saying why, only when no chromium exists (scripts/browser.sh installs it with apt-get).
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import SERVICE_OVERRIDES
from tests.factories import make_cluster
from tests.integration.conftest import services
from vmsched.client import SchedulerClient
from vmsched.settings import Settings
from vmsched_services.api.auth import Role, entry_line

pytest.importorskip("playwright.async_api", reason="the playwright package is not installed")

from playwright.async_api import ConsoleMessage, Page, async_playwright

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "bench-results" / "screenshots"
BUILTIN = "evenly_distributed"
#: Host i: CPU load %, free memory MB (of 32000). The last has too little memory for the test's VM.
HOSTS = [(10, 30000), (35, 20000), (60, 12000), (85, 6000), (20, 25000), (5, 300)]
VM_MEM_MB = 2048
TIMEOUT_MS = 20_000


def chromium() -> str | None:
    """Debian's chromium (or the browser VMSCHED_CHROMIUM names, or one on PATH)."""
    for candidate in (os.environ.get("VMSCHED_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


BROWSER = chromium()
if BROWSER is None:
    pytest.skip(
        "no chromium: `make setup` installs it with apt-get (scripts/browser.sh), or set VMSCHED_CHROMIUM",
        allow_module_level=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Console:
    base: str
    token: str
    cluster: str
    hosts: list[str]
    settings: Settings
    viewer_token: str = ""
    problems: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
async def console(
    settings: Settings, migrated_database: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Console]:
    token, viewer = f"vms_console-e2e-{uuid.uuid4().hex}", f"vms_console-viewer-{uuid.uuid4().hex}"
    tokens_file = tmp_path_factory.mktemp("api") / "tokens"
    tokens_file.write_text(
        f"# made by {__name__}\n{entry_line('console-e2e', Role.ADMIN, token)}\n"
        f"{entry_line('console-viewer', Role.VIEWER, viewer)}\n"
    )
    port = free_port()
    cfg = settings.model_copy(
        update={
            "postgres_url": migrated_database,
            **SERVICE_OVERRIDES,
            # The api's broker user here is the test's: policy-admin takes its word for whose token it is.
            "api_users": settings.amqp_user or "guest",
            "api_host": "127.0.0.1",
            "api_port": port,
            "api_tokens": tokens_file.read_text(),
        }
    )
    names = ("state-tracker", "filter-worker", "weigher", "selector", "ha-monitor", "policy-admin", "api")
    async with services(cfg, *names):
        cluster = f"console-{uuid.uuid4().hex[:6]}"
        client = SchedulerClient(cfg)
        async with client:
            hosts = await make_cluster(
                client,
                cluster,
                len(HOSTS),
                vary=lambda i: {"cpu_usage_pct": HOSTS[i][0], "mem_free_mb": HOSTS[i][1]},
                cpu_cores=8,
                physical_mem_mb=32000,
            )
        yield Console(f"http://127.0.0.1:{port}", token, cluster, hosts, cfg, viewer)


async def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def watch(page: Page, problems: list[str]) -> None:
    """Every console error and uncaught exception of `page`, noted."""

    def console_message(m: ConsoleMessage) -> None:
        if m.type == "error":
            problems.append(f"{page.url}: console error: {m.text}")

    page.on("console", console_message)
    page.on("pageerror", lambda e: problems.append(f"{page.url}: uncaught: {e}"))


async def test_the_console_end_to_end(console: Console) -> None:
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=BROWSER, args=["--no-sandbox"], headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 800})
            context.set_default_timeout(TIMEOUT_MS)
            page = await context.new_page()
            watch(page, console.problems)
            await sign_in(page, console)
            policy = await edit_a_policy(page, console)
            decision = await watch_a_decision_arrive(page, console, policy)
            await why_not(page, console, decision)
            await what_if(page, console)
            await simulate(page, console)
        finally:
            await browser.close()
    assert console.problems == []


async def test_a_viewer_sees_which_controls_need_another_role(console: Console) -> None:
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=BROWSER, args=["--no-sandbox"], headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 800})
            context.set_default_timeout(TIMEOUT_MS)
            page = await context.new_page()
            problems: list[str] = []
            watch(page, problems)
            await page.goto(f"{console.base}/console/login?next=/console/policies/power_saving")
            await page.fill("#token", console.viewer_token)
            await page.click("button[type=submit]")
            await page.wait_for_url("**/console/policies/power_saving")
            assert "viewer" in (await page.text_content("#role-note") or "")
            assert await page.is_disabled("#apply")
            assert "admin role" in (await page.get_attribute("#apply", "title") or "")
            assert await page.is_enabled("#preview")  # checking and previewing are reads
            await page.goto(f"{console.base}/console/whatif")
            assert await page.is_disabled("button[data-needs=operator]")
            await shot(page, "viewer-whatif")
        finally:
            await browser.close()
    assert problems == []


async def sign_in(page: Page, c: Console) -> None:
    await page.goto(f"{c.base}/console/policies")
    assert "/console/login" in page.url  # no session yet
    await shot(page, "login")
    await page.fill("#token", "vms_not-a-token")
    await page.click("button[type=submit]")
    assert "not valid" in (await page.text_content("#login-error") or "")
    await page.fill("#token", c.token)
    await page.click("button[type=submit]")
    await page.wait_for_url("**/console/policies")  # back where it was going
    await page.goto(f"{c.base}/console/clusters")
    await page.wait_for_selector(f"#clusters a[href='/console/clusters/{c.cluster}']")
    await shot(page, "clusters")


async def edit_a_policy(page: Page, c: Console) -> str:
    """Clone a built-in, attach the clone to the cluster, change a factor, preview, apply: version 2."""
    name = f"{c.cluster}-policy"
    await page.goto(f"{c.base}/console/policies/{BUILTIN}")
    await page.wait_for_selector("#locked-note:not([hidden])")
    assert await page.is_disabled("#apply")
    await page.fill("#clone-name", name)
    await page.click("#clone button[type=submit]")
    await page.wait_for_url(f"**/console/policies/{name}")
    await page.wait_for_selector("#validity.ok")

    await page.select_option("#attach-cluster", c.cluster)
    await page.click("#attach button[type=submit]")
    await page.wait_for_selector(f"#attached a[href='/console/clusters/{c.cluster}']")

    # A property checked as it is typed: the error shows next to the field, then goes.
    prop = page.locator("#properties input[data-prop='HighUtilization']")
    await prop.fill("lots")
    await page.wait_for_selector("#properties input[data-prop='HighUtilization'][aria-invalid='true']")
    await page.wait_for_selector("#validity.bad")
    await shot(page, "policy-invalid")
    await prop.fill("75")
    await page.wait_for_selector("#validity.ok")

    await page.fill("#weights li[data-unit='OptimalForEvenCpuDistribution'] input.factor", "5")
    await page.wait_for_selector("#validity.ok")
    await page.click("#preview")
    await page.wait_for_selector("#diff-box:not([hidden]) #diff .line")
    diff = await page.text_content("#diff") or ""
    assert "5" in diff
    assert "HighUtilization" in diff
    await shot(page, "policy-diff")
    await page.click("#apply")
    await page.wait_for_selector("#badges :text('version 2')")
    await page.wait_for_selector("#history button.rollback[data-version='1']")
    # The history names the person behind the token, as the api vouched for them.
    assert "for console-e2e" in (await page.text_content("#history") or "")
    await shot(page, "policy-applied")
    return name


async def watch_a_decision_arrive(page: Page, c: Console, policy: str) -> dict[str, object]:
    """With the cluster page open, a VM scheduled through the API appears without a reload."""
    await page.goto(f"{c.base}/console/clusters/{c.cluster}")
    await page.wait_for_selector(".live.on")
    await page.wait_for_selector(f"#heatmap [data-host='{c.hosts[0]}']")
    async with httpx.AsyncClient(base_url=c.base, headers={"Authorization": f"Bearer {c.token}"}) as http:
        r = await http.post(
            f"/api/v1/clusters/{c.cluster}/schedule",
            json={"vm": {"vm_id": "console-vm", "mem_mb": VM_MEM_MB, "vcpus": 2}, "explain_scores": True,
                  "explain_hosts": True},
            timeout=30,
        )  # fmt: skip
    assert r.status_code == 200, r.text
    decision: dict[str, object] = r.json()
    assert decision["status"] == "placed"
    assert decision["policy"] == policy
    assert decision["policy_version"] == 2
    item = page.locator(f"#decisions li[data-request='{decision['request_id']}']")
    await item.wait_for()
    # Its resources are pending on the chosen host until the engine reports the VM running.
    await page.wait_for_selector(
        f"#pending tbody tr:has(td:text-is('console-vm')):has(td:text-is('{decision['host_id']}'))"
    )
    await page.select_option("#metric", "mem")
    await shot(page, "cluster")
    return decision


async def why_not(page: Page, c: Console, decision: dict[str, object]) -> None:
    await page.click(f"#decisions li[data-request='{decision['request_id']}'] a")
    await page.wait_for_url(f"**/decisions/{decision['request_id']}")
    await page.wait_for_selector("#explain-table tbody tr")
    rows = await page.locator("#explain-table tbody tr").count()
    assert rows == len(HOSTS)
    small = c.hosts[-1]
    await page.fill("#why-host", small)
    await page.press("#why-host", "Enter")
    answer = await page.text_content("#why-answer")
    assert answer is not None
    assert answer.startswith(f"{small} was removed by the Memory filter"), answer
    assert await page.locator(f"#explain-table tr.highlight[data-host='{small}']").count() == 1
    # Sorting by a column header, from the keyboard.
    await page.focus("#explain-table thead th:nth-child(1) button")
    await page.keyboard.press("Enter")
    await page.keyboard.press("Enter")
    first = await page.text_content("#explain-table tbody tr:first-child th")
    assert first == sorted(c.hosts)[-1]
    await shot(page, "decision")


async def what_if(page: Page, c: Console) -> None:
    await page.goto(f"{c.base}/console/whatif?cluster={c.cluster}")
    await page.fill("#mem", "4096")
    await page.click("#whatif button[type=submit]")
    await page.wait_for_selector("#result:not([hidden]) #explain-table tbody tr")
    assert await page.locator("#explain-table tbody tr").count() == len(HOSTS)
    assert "Placed on" in (await page.text_content("#result-head") or "")
    await shot(page, "whatif")


async def simulate(page: Page, c: Console) -> None:
    await page.goto(f"{c.base}/console/simulation")
    await page.select_option("#policy-a", "none")
    await page.select_option("#policy-b", "power_saving")
    await page.fill("#hosts", "6")
    await page.fill("#vms", "40")
    await page.fill("#hours", "1")
    await page.click("#simulate button[type=submit]")
    await page.wait_for_selector("#report:not([hidden]) svg.plot", timeout=90_000)
    assert await page.locator("#summary thead th").count() == 3
    await shot(page, "simulation")
