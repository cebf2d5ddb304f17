"""What every `vmsched` command shares: exit codes, the errors a command raises for its user, the
settings, argument types for ids, help text naming environment variables, and confirmation.

Only the standard library is imported at module level: `vmsched --help` builds every parser and
must not load pydantic, the drivers or the services.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vmsched.errors import CommandError, NotFound, UsageError

if TYPE_CHECKING:
    from vmsched.settings import Settings

#: Exit codes, the same for every command (`vmsched --help` and the README list them).
EXIT_OK = 0
#: `schedule`: no host can take the VM; other commands: nothing found, or a check that fails.
EXIT_UNPLACEABLE = EXIT_NOT_FOUND = EXIT_CHECK_FAILED = 1
#: A usage mistake: bad options (argparse's own code), a missing or invalid input file, a bad id.
EXIT_USAGE = 2
#: The command could not be carried out: a server down, a request refused, a service not answering.
EXIT_ERROR = 3
#: Ctrl-C.
EXIT_INTERRUPTED = 130
#: The reader of the output went away (`vmsched watch | head`): 128 + SIGPIPE, as Unix tools end.
EXIT_BROKEN_PIPE = 141

#: Set (to anything but 0/false/no) to print tracebacks of unexpected errors, as --debug does.
DEBUG_ENV = "VMSCHED_DEBUG"


def exit_code(exc: CommandError) -> int:
    """What a command's own error exits with: 2 for a usage mistake, 1 for nothing found, else 3."""
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    return EXIT_ERROR


def settings() -> Settings:
    """The settings from the environment (VMSCHED_<NAME> or VMSCHED_<NAME>_FILE); a value that does not
    validate, or a file that cannot be read, is a usage error naming its variable.

    The one feeder of the process's secret registry (vmsched.logging.SECRETS): every command and
    service process gets its Settings here, so its credentials are masked in whatever it logs or prints.
    """
    from pydantic import ValidationError

    from vmsched.errors import SettingsFileError
    from vmsched.logging import SECRETS
    from vmsched.settings import Settings

    try:
        found = Settings()
    except SettingsFileError as exc:
        raise UsageError(str(exc), hint="fix the file or the variable (docs/operating.md, Settings)") from None
    except ValidationError as exc:
        problems = "; ".join(_setting_problem(e["loc"], e["msg"]) for e in exc.errors())
        raise UsageError(f"invalid setting: {problems}", hint="fix or unset the variable") from None
    SECRETS.add(found.secret_values())
    return found


def _setting_problem(loc: tuple[int | str, ...], msg: str) -> str:
    """One invalid setting, named by its variable once (a check of ours names it in its message)."""
    msg = msg.removeprefix("Value error, ")
    name = env_name(str(loc[0])) if loc else "VMSCHED_*"
    return msg if msg.startswith(name) else f"{name}: {msg}"


def env_name(field: str) -> str:
    return f"VMSCHED_{field.upper()}"


def env_help(field: str, text: str) -> str:
    """Help text for an option a setting backs: what it does, its variable, and the built-in default."""
    from vmsched.settings import Settings

    default = Settings.model_fields[field].default
    return f"{text} (default: ${env_name(field)}, else {default})"


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def redacted(url: str) -> str:
    """A server URL without its password, for messages (vmsched.settings.redacted_url)."""
    from vmsched.settings import redacted_url

    return redacted_url(url)


# ---------------------------------------------------------------- argument types
def _id_rules() -> tuple[Any, int, int]:
    """The contracts' Id constraints (pattern, lengths), read from the type itself so they cannot drift."""
    import re

    from pydantic import StringConstraints

    from vmsched.contracts.base import Id

    for meta in getattr(Id, "__metadata__", ()):
        if isinstance(meta, StringConstraints):
            return re.compile(str(meta.pattern)), int(meta.min_length or 1), int(meta.max_length or 64)
    raise AssertionError("contracts.base.Id has no StringConstraints")


def vmsched_id(value: str) -> str:
    """argparse type for cluster, host and VM ids: what the contracts accept, said plainly."""
    pattern, low, high = _id_rules()
    if not (low <= len(value) <= high) or not pattern.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a valid id: {low} to {high} letters, digits and . _ : @ -, "
            "starting with a letter or digit"
        )
    return value


def cluster_or_all(value: str) -> str:
    """argparse type for `watch --cluster`: a cluster id, or * for every cluster."""
    return value if value == "*" else vmsched_id(value)


def request_id(value: str) -> uuid.UUID:
    """argparse type for request ids (UUIDs)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a request id: a UUID such as 123e4567-e89b-12d3-a456-426614174000"
        ) from None


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return n


def seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not s > 0:
        raise argparse.ArgumentTypeError(f"{value} is not more than 0 seconds")
    return s


# ---------------------------------------------------------------- parsers
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (they hold tables); options wrapped as usual."""


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's own default must not overwrite `vmsched --debug CMD`.
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help=f"print the traceback of an unexpected error (or set ${DEBUG_ENV}=1)",
    )
    return common


_COMMON = _common_options()

SubParsers = argparse._SubParsersAction  # the type add_subparsers returns (argparse names it privately)


def command(
    sub: SubParsers[argparse.ArgumentParser],
    name: str,
    help: str,
    fn: Callable[[argparse.Namespace], int],
    *,
    needs: str | None = None,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand running `fn(args) -> exit code`; `needs` names the service it talks to, for the
    hint when nobody answers."""
    p = sub.add_parser(
        name, help=help, description=description or help, parents=[_COMMON], formatter_class=HelpFormatter
    )
    p.set_defaults(fn=fn, needs=needs)
    return p


def group(sub: SubParsers[argparse.ArgumentParser], name: str, help: str) -> SubParsers[argparse.ArgumentParser]:
    """A subcommand with subcommands of its own (`vmsched dead-letters list`)."""
    p = sub.add_parser(name, help=help, description=help, parents=[_COMMON], formatter_class=HelpFormatter)
    return p.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def add_cluster(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--cluster", required=required, type=vmsched_id, metavar="C", help="the cluster's id")


def add_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=env_help("rpc_timeout_s", "how long to wait for the service's answer"),
    )


# ---------------------------------------------------------------- confirmation
def confirm(question: str, *, yes: bool) -> None:
    """Go on only if `yes` was given or the user says so at a terminal; UsageError otherwise."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question} needs confirmation", hint="pass --yes (no terminal to ask at)")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise NotFound("not confirmed; nothing done")


__all__ = [
    "DEBUG_ENV",
    "EXIT_BROKEN_PIPE",
    "EXIT_CHECK_FAILED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNPLACEABLE",
    "EXIT_USAGE",
    "CommandError",
    "HelpFormatter",
    "NotFound",
    "SubParsers",
    "UsageError",
    "add_cluster",
    "add_json",
    "add_timeout",
    "cluster_or_all",
    "command",
    "confirm",
    "debug_requested",
    "env_help",
    "env_name",
    "exit_code",
    "group",
    "positive_int",
    "redacted",
    "request_id",
    "seconds",
    "settings",
    "vmsched_id",
]
