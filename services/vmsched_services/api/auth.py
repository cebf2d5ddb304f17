"""The HTTP API's bearer tokens: who holds which role, from the tokens file.

The file (VMSCHED_API_TOKENS_FILE, read through the settings' `_FILE` convention into
VMSCHED_API_TOKENS) holds one token per line, `NAME ROLE sha256:HEX`; blank lines and `#` comments
are skipped. Only the SHA-256 of each token is stored, so the file is no secret by itself, and a
token is checked by hashing what a request presents and comparing it with every entry in constant
time (hmac.compare_digest). A token is never logged: only its entry's name is.

Roles are ordered viewer < operator < admin: each may do what the roles below it may.
`vmsched api token add NAME --role ROLE` makes a token, appends its line and prints the token once.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from vmsched.errors import UsageError

#: A token's name, as the audit log names it ("vmsched-api for NAME"): short, printable, no spaces.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_HASH = re.compile(r"^sha256:([0-9a-f]{64})$")
#: What `vmsched api token add` prefixes a token with, so one found in a log or a repository is recognisable.
TOKEN_PREFIX = "vms_"


class Role(enum.IntEnum):
    """What a token may do; a higher role may do everything a lower one may."""

    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Role:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise UsageError(
                f"unknown role {text!r}", hint=f"a role is one of {', '.join(r.label for r in cls)}"
            ) from None


@dataclass(frozen=True)
class TokenEntry:
    name: str
    role: Role
    #: The token's SHA-256, as bytes.
    digest: bytes


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def entry_line(name: str, role: Role, token: str) -> str:
    """The tokens file's line for `token` (its hash only)."""
    return f"{name} {role.label} sha256:{digest(token).hex()}"


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def parse_tokens(text: str, source: str = "VMSCHED_API_TOKENS") -> list[TokenEntry]:
    """The entries of a tokens file's text; UsageError naming the line of the first one that is wrong
    (never quoting a hash, which would not help, nor anything after it)."""
    entries: list[TokenEntry] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"{source} line {number}"
        form = "each line is `NAME ROLE sha256:HEX` (`vmsched api token add` writes them)"
        if len(parts) != 3:
            raise UsageError(f"{where}: expected 3 fields, found {len(parts)}", hint=form)
        name, role, hashed = parts
        if not NAME_PATTERN.match(name):
            raise UsageError(f"{where}: {name[:64]!r} is not a token name (letters, digits, . _ @ -)", hint=form)
        if name in names:
            raise UsageError(f"{where}: the name {name} is listed twice", hint="each token has a name of its own")
        match = _HASH.match(hashed)
        if match is None:
            raise UsageError(f"{where}: the third field is not sha256:<64 hex digits>", hint=form)
        try:
            parsed = Role.parse(role)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}", hint=exc.hint) from None
        names.add(name)
        entries.append(TokenEntry(name, parsed, bytes.fromhex(match.group(1))))
    return entries


class TokenBook:
    """The tokens the api accepts."""

    def __init__(self, entries: list[TokenEntry]) -> None:
        self.entries = tuple(entries)

    @classmethod
    def from_text(cls, text: str) -> TokenBook:
        return cls(parse_tokens(text))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def find(self, token: str) -> TokenEntry | None:
        """The entry of `token`, or None. Every entry is compared, in constant time each, so how long
        this takes does not say how much of a hash matched, nor which entry."""
        presented = digest(token)
        found = None
        for entry in self.entries:
            if hmac.compare_digest(presented, entry.digest):
                found = entry
        return found


def add_token(path: Path, name: str, role: Role) -> str:
    """Append a new token for `name` to the tokens file at `path` (created, mode 0600); return the
    token, which is stored nowhere else. UsageError if the name is taken or the file is not one."""
    if not NAME_PATTERN.match(name):
        raise UsageError(f"{name[:64]!r} is not a token name", hint="letters, digits, . _ @ - (64 at most)")
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if any(e.name == name for e in parse_tokens(text, str(path))):
        raise UsageError(f"{path} already has a token named {name}", hint="choose another name, or edit the file")
    token = new_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.touch(mode=0o600)
    with path.open("a", encoding="utf-8") as f:
        if text and not text.endswith("\n"):
            f.write("\n")
        f.write(entry_line(name, role, token) + "\n")
    return token


__all__ = [
    "NAME_PATTERN",
    "Role",
    "TokenBook",
    "TokenEntry",
    "add_token",
    "digest",
    "entry_line",
    "new_token",
    "parse_tokens",
]
