"""The Redis ACL rules of each role (vmsched_services.tools.security.redis_acl), without a server:
what they grant, what they never grant, and that they keep up with the keys and scripts of vmsched.store."""

from __future__ import annotations

import fnmatch
import hashlib
import re
from pathlib import Path

import pytest

from vmsched import store
from vmsched.constants import LEASE_BALANCER, LEASE_HA_MONITOR
from vmsched.store.keys import Keys
from vmsched_services.tools.security.redis_acl import (
    ACCESS,
    CLUSTER_COMMANDS,
    REDIS_ROLES,
    SETINFO_COMMANDS,
    access_table,
    aclfile,
    password_hash,
    permissions,
    users,
)
from vmsched_services.tools.security.roles import ADMIN, API, ENGINE, SERVICE_ROLES, user_name

PASSWORDS = {role: f"secret-{role}" for role in REDIS_ROLES}
#: Commands no role may have: they empty, reconfigure, watch or stop the server, or list every key.
FORBIDDEN = {
    "flushall",
    "flushdb",
    "keys",
    "scan",
    "config",
    "acl",
    "debug",
    "monitor",
    "shutdown",
    "client",
    "function",
    "script",
    "script|flush",
    "eval",
    "info",
    "save",
    "bgsave",
    "replicaof",
    "slaveof",
    "migrate",
    "module",
    "swapdb",
    "cluster",
}


def granted(rules: list[str]) -> set[str]:
    return {r[1:] for r in rules if r.startswith("+")}


def patterns(rules: list[str], kind: str) -> list[str]:
    """The root key patterns of the rules: `~` read-write, `%R~` read-only (the selector aside)."""
    mark = {"rw": "~", "r": "%R~"}[kind]
    return [r[len(mark) :] for r in rules if r.startswith(mark)]


def selector(rules: list[str]) -> str:
    (sel,) = [r for r in rules if r.startswith("(")]
    return sel


def matches(pattern: str, key: str) -> bool:
    """Redis glob as far as these patterns use it (`*`; the test prefix has no special characters)."""
    return fnmatch.fnmatchcase(key, pattern.replace("[", "[[]"))


def test_every_role_but_the_engine_and_the_api_has_a_user() -> None:
    assert set(REDIS_ROLES) == {*SERVICE_ROLES, ADMIN}
    assert ENGINE not in REDIS_ROLES
    assert API not in REDIS_ROLES
    with pytest.raises(ValueError, match="the engine has no Redis user"):
        permissions(ENGINE)
    with pytest.raises(ValueError, match="the api has no Redis user"):
        permissions(API)
    with pytest.raises(ValueError, match="unknown role 'nobody'"):
        permissions("nobody")


@pytest.mark.parametrize("role", REDIS_ROLES)
def test_rules_start_from_nothing_and_grant_commands_one_by_one(role: str) -> None:
    rules = permissions(role)
    assert rules[:2] == ["resetchannels", "-@all"]
    assert not [r for r in rules[2:] if "@" in r], "a category grants commands nobody named"
    assert not granted(rules) & FORBIDDEN
    assert {"ping", "evalsha", "script|load"} <= granted(rules)
    assert selector(rules).startswith("(+evalsha ")  # EVALSHA alone may name the read-only keys


@pytest.mark.parametrize("role", REDIS_ROLES)
def test_every_key_pattern_is_under_the_prefix(role: str) -> None:
    rules = permissions(role, "tenant-a")
    keyed = [*patterns(rules, "rw"), *patterns(rules, "r"), *selector(rules).strip("()").split()[1:]]
    assert keyed
    for pattern in keyed:
        assert pattern.lstrip("~").startswith("tenant-a:"), pattern


def test_the_selector_names_exactly_the_roles_keys_for_evalsha() -> None:
    rules = permissions("balancer")
    sel = selector(rules).strip("()").split()
    assert sel[0] == "+evalsha"
    assert [p.lstrip("~") for p in sel[1:]] == [*patterns(rules, "rw"), *patterns(rules, "r")]


def test_who_may_write_what() -> None:
    k = Keys("vmsched")
    cluster = "c1"

    def writers(key: str) -> set[str]:
        return {role for role in REDIS_ROLES if any(matches(p, key) for p in patterns(permissions(role), "rw"))}

    def readers(key: str) -> set[str]:
        rules = {role: permissions(role) for role in REDIS_ROLES}
        return {r for r, rs in rules.items() if any(matches(p, key) for p in patterns(rs, "r"))} | writers(key)

    assert writers(k.lock(cluster)) == writers(k.fence(cluster)) == {"selector"}
    assert writers(k.pending(cluster)) == {"selector", "state-tracker", "balancer", "ha-monitor"}
    assert writers(k.state_version(cluster)) == writers(k.state_hosts(cluster)) == {"state-tracker"}
    assert writers(k.clusters()) == {"state-tracker"}
    assert writers(k.decision(cluster, "r1")) == {"selector"}
    # The history's reader drops expired ids from it: the CLI's `decisions` and `decisions.recent`.
    assert writers(k.decision_history(cluster)) == {"selector", "state-tracker", ADMIN}
    assert writers(k.lease(LEASE_BALANCER, cluster)) == {"balancer"}
    assert writers(k.lease(LEASE_HA_MONITOR, cluster)) == {"ha-monitor"}
    assert writers(k.cooldown(cluster, "vm")) == {"balancer"}
    assert writers(k.migration_budget(cluster)) == {"balancer"}
    assert readers(k.migration_budget(cluster)) == {"balancer"}
    assert writers(k.unit_catalogue("weigher", "i1")) == {"weigher"}
    assert writers(k.unit_catalogue_index()) == set(SERVICE_ROLES)
    # The workers read the state and nothing else of the clusters.
    assert readers(k.state_hosts(cluster)) >= {"filter-worker", "weigher", "selector", "balancer", "ha-monitor"}
    for worker in ("filter-worker", "weigher"):
        assert worker not in readers(k.pending(cluster)) | readers(k.lock(cluster)) | readers(k.decision(cluster, "r"))
    # Policy-admin checks a policy's units against them, the selector routes around workers lacking some.
    assert readers(k.unit_catalogue("weigher", "i1")) == {"weigher", "policy-admin", "selector"}
    assert readers(k.decision(cluster, "r1")) == {"selector", "state-tracker", ADMIN}


def test_every_key_vmsched_writes_has_a_writer() -> None:
    """A key kind added to vmsched.store.keys without an ACL entry would be refused to everyone."""
    k = Keys("vmsched")
    written = [
        *k.of_cluster("c1"),
        *(p.replace("*", "vm1") for p in k.cluster_patterns("c1")),
        k.clusters(),
        k.decision("c1", "r1"),
        k.unit_catalogue("selector", "i1"),
        k.unit_catalogue_index(),
    ]
    rw = [p for role in REDIS_ROLES for p in patterns(permissions(role), "rw")]
    assert [key for key in written if not any(matches(p, key) for p in rw)] == []


def test_every_command_the_stores_scripts_call_is_granted_to_someone() -> None:
    """The Lua scripts' commands are checked by ACL like any other: a new one needs a grant."""
    sources = "".join(p.read_text() for p in Path(store.__file__).parent.glob("*.py"))
    called = {c.lower() for c in re.findall(r"redis\.call\('([A-Za-z]+)'", sources)}
    called = {"info|server" if c == "info" else c for c in called}
    assert "info|server" in called  # the generation check
    everyone = {c for a in ACCESS.values() for c in a.commands}
    assert called - everyone == set()


def test_glob_characters_in_the_prefix_match_literally() -> None:
    rules = permissions("weigher", "a*b[1]")
    assert "%R~a\\*b\\[1\\]:state:version:*" in rules


@pytest.mark.parametrize("prefix", ["", "with space", "br{ace}"])
def test_prefixes_that_cannot_be_patterns_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        permissions("selector", prefix)


def test_cluster_and_setinfo_add_what_those_clients_send() -> None:
    plain = granted(permissions("selector"))
    assert granted(permissions("selector", cluster=True)) - plain == set(CLUSTER_COMMANDS)
    assert granted(permissions("selector", client_setinfo=True)) - plain == set(SETINFO_COMMANDS)


def test_passwords_are_kept_as_their_sha256_only() -> None:
    digest = hashlib.sha256(b"secret-selector").hexdigest()
    assert password_hash("secret-selector") == digest
    assert password_hash(f"#{digest}") == digest  # given hashed already
    (selector_user,) = users(PASSWORDS, roles=["selector"])
    assert selector_user.name == user_name("selector") == "vmsched-selector"
    assert selector_user.setuser_args()[:4] == ["vmsched-selector", "reset", "on", f"#{digest}"]
    line = selector_user.aclfile_line()
    assert line.startswith(f"user vmsched-selector on #{digest} resetchannels -@all ")
    text = aclfile(users(PASSWORDS))
    assert "secret-" not in text
    assert len(text.splitlines()) == len(REDIS_ROLES) + 1


def test_a_missing_or_empty_password_is_refused_naming_the_roles() -> None:
    with pytest.raises(ValueError, match="no Redis password for weigher, admin"):
        users({r: p for r, p in PASSWORDS.items() if r not in ("weigher", ADMIN)})
    with pytest.raises(ValueError, match="no Redis password for selector"):
        users({**PASSWORDS, "selector": ""})


def test_the_aclfile_switches_the_default_user_off_unless_told_not_to() -> None:
    last = aclfile(users(PASSWORDS)).splitlines()[-1]
    assert last == "user default off resetpass resetkeys resetchannels -@all"
    assert "user default" not in aclfile(users(PASSWORDS), disable_default=False)


def test_the_table_has_a_row_per_role_and_escapes_pipes() -> None:
    table = access_table()
    rows = table.splitlines()[2:]
    assert [r.split("|")[1].split()[0] for r in rows] == [*REDIS_ROLES, ENGINE, API]
    assert "`info\\|server`" in table
    assert all(r.count("|") - r.count("\\|") == 5 for r in rows)
