"""Every file (and standard input) a `vmsched` command reads, read with a size cap checked before it
is parsed: a file over its cap is refused from its size alone (stat), and a stream (standard input,
a pipe, a device) is read at most cap + 1 bytes. Parsing the text is vmsched.bounded_text's.

The caps are sized for what each file legitimately holds, and those a real user could outgrow have
a flag (docs/operating.md lists them).

Only the standard library is imported at module level: `vmsched --help` builds the parsers, which
use `byte_size`.
"""

from __future__ import annotations

import argparse
import codecs
import os
import re
import stat
import sys
from collections.abc import Iterator

from vmsched.errors import UsageError

KB = 1024
MB = 1024 * KB

#: A policy set (`vmsched policy apply -f`, `simulate --policy FILE`) is a few KB; 1 MB is a thousand
#: policies of ten units each, and YAML that size parses in about a second. Flag: --max-size.
POLICY_CAP = 1 * MB
#: nova.conf (`policy import-nova`) is some KB; 4 MB leaves room for one carrying every option's help.
#: configparser reads it in linear time. No flag: nobody has a bigger one.
NOVA_CONF_CAP = 4 * MB
#: A VM (`vmsched schedule --vm`) is a few hundred bytes; no flag (the bus carries 4 MB at most).
VM_CAP = 1 * MB
#: Hosts' reports (`vmsched hosts register`): a host is about 1 KB as JSON (networks, traits, groups
#: make it more), so 4 MB is some thousands of hosts, more than a cluster has; YAML that size reads in
#: some seconds. Flag: --max-size.
HOSTS_CAP = 4 * MB
#: A workload as JSON or CSV (both parsed in C): 64 MB is ~400,000 VM arrivals, several times the
#: simulator's 100,000-event target; it reads in seconds. Flag: simulate --max-workload-size.
WORKLOAD_CAP = 64 * MB
#: A workload as YAML: YAML costs ten times what JSON does to read (libyaml's parser with PyYAML's
#: composer and constructor: some seconds and 70 MB of memory per MB), so its cap is 10 MB: what
#: `simulate --out` writes for the simulator's 100,000-event target (8.4 MB) fits. Bigger: as JSON,
#: or with --max-workload-size.
WORKLOAD_YAML_CAP = 10 * MB


def human(n: int) -> str:
    """A size as people say it: 1 MB, 20.0 MB, 512 KB, 300 bytes."""
    for unit, size in (("GB", 1024 * MB), ("MB", MB), ("KB", KB)):
        if n >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{n} bytes"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)


def byte_size(value: str) -> int:
    """argparse type for a size: bytes, or with K, M or G (KB, MB, GB; powers of 1024)."""
    match = _SIZE.match(value)
    if match is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size: bytes, or a number with K, M or G (5M, 64MB)")
    n = int(float(match.group(1)) * {"": 1, "k": KB, "m": MB, "g": 1024 * MB}[match.group(2).lower()])
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 byte or more")
    return n


def read_bounded(path: str, cap: int, what: str, kind: str, *, hint: str | None = None) -> str:
    """The text of `path` ("-": standard input), refused with a UsageError, before any of it is
    parsed, when it is more than `cap` bytes, saying "{what} NAME is SIZE; {kind} are at most CAP"
    (what: "policy file", kind: "policies") and `hint` (how to read a bigger one). Unreadable or not
    UTF-8 is a UsageError too."""
    name = f"{what} on standard input" if path == "-" else f"{what} {path}"
    try:
        if path == "-":
            data = sys.stdin.buffer.read(cap + 1)
        else:
            with open(path, "rb") as fh:
                info = os.fstat(fh.fileno())
                # A regular file's size is known before reading; a pipe's, a device's or /proc's is not.
                if stat.S_ISREG(info.st_mode) and info.st_size > cap:
                    raise _too_big(name, human(info.st_size), kind, cap, hint)
                data = fh.read(cap + 1)
    except OSError as exc:
        raise UsageError(
            f"{'standard input' if path == '-' else path}: cannot read it ({exc.strerror or exc})"
        ) from None
    if len(data) > cap:
        raise _too_big(name, f"more than {human(cap)}", kind, cap, hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name}: not UTF-8 text (byte {exc.start + 1} is not)") from None


def read_chunks_bounded(
    path: str, cap: int, what: str, kind: str, *, hint: str | None = None, chunk: int = MB
) -> Iterator[str]:
    """The text of `path` as read_bounded reads it, but as chunks of about `chunk` bytes, for a reader
    that parses as it goes (a JSON workload): a regular file over `cap` is refused before this
    returns, a stream when more than `cap` bytes have come."""
    name = f"{what} {path}"
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the generator below
        info = os.fstat(fh.fileno())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if stat.S_ISREG(info.st_mode) and info.st_size > cap:
        fh.close()
        raise _too_big(name, human(info.st_size), kind, cap, hint)

    def chunks() -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")()
        total = 0
        with fh:
            while True:
                try:
                    data = fh.read(chunk)
                except OSError as exc:
                    raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
                total += len(data)
                if total > cap:
                    raise _too_big(name, f"more than {human(cap)}", kind, cap, hint)
                try:
                    yield decoder.decode(data, final=not data)
                except UnicodeDecodeError as exc:
                    raise UsageError(
                        f"{name}: not UTF-8 text (byte {total - len(data) + exc.start + 1} is not)"
                    ) from None
                if not data:
                    return

    return chunks()


def _too_big(name: str, size: str, kind: str, cap: int, hint: str | None) -> UsageError:
    return UsageError(f"{name} is {size}; {kind} are at most {human(cap)} (is this the right file?)", hint=hint)


__all__ = [
    "HOSTS_CAP",
    "NOVA_CONF_CAP",
    "POLICY_CAP",
    "VM_CAP",
    "WORKLOAD_CAP",
    "WORKLOAD_YAML_CAP",
    "byte_size",
    "human",
    "read_bounded",
    "read_chunks_bounded",
]
