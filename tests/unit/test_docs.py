"""README.md and docs/*.md stay true to the code.

For each page: every repository path written in backticks exists, every `vmsched <command>` named is
a command the `vmsched` entry point accepts, every VMSCHED_* variable named is a setting (or one the
command's --help documents), every "N built-in units" is the registry's count, and every relative
link resolves (anchors included). The README stays a front door of at most 200 lines, and keeps the
line `make test` (CI runs the README's test command). Each failure names the page, the line and the
string.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import tomllib
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from pathlib import Path

import pytest

from vmsched.scheduling.units.registry import BUILTIN_UNITS
from vmsched.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200

#: Where a path in backticks may be relative to: the repository, the library, the services package.
BASES = (ROOT, ROOT / "libs/common/vmsched", ROOT / "services/vmsched_services")
#: Paths the pages name that are not in the repository: what a run writes (bench results, the browser
#: test's screenshots), never committed.
NOT_IN_REPOSITORY = frozenset({"bench-results/bench.json", "bench-results/screenshots/"})

_FENCE = re.compile(r"^\s*```")
_SPAN = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"[\w.][\w.\-]*(?:/[\w.\-]+)*/?")
_COMMAND = re.compile(r"(?:^|[\s/])vmsched ([a-z][\w-]*)(?: +([a-z][\w-]*))?")
_FENCED_COMMAND = re.compile(r"^\s*(?:\$\s+)?vmsched ([a-z][\w-]*)(?: +([a-z][\w-]*))?", re.MULTILINE)
_SETTING = re.compile(r"VMSCHED_[A-Z0-9_]*[A-Z0-9]")
_UNIT_COUNT = re.compile(r"(\d[\d,]*)\s+built-in\s+units")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


class Page:
    """One Markdown page, split into prose (fenced blocks blanked, line numbers kept) and fenced code."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = path.read_text(encoding="utf-8")
        prose: list[str] = []
        fenced: list[str] = []
        inside = False
        for line in self.text.splitlines():
            if _FENCE.match(line):
                inside = not inside
                prose.append("")
                fenced.append("")
            elif inside:
                prose.append("")
                fenced.append(line)
            else:
                prose.append(line)
                fenced.append("")
        self.prose = "\n".join(prose)
        self.fenced = "\n".join(fenced)

    def where(self, text: str, offset: int) -> str:
        return f"{_page_id(self.path)}:{text.count(chr(10), 0, offset) + 1}"

    def spans(self) -> Iterator[tuple[str, str]]:
        """(where, content) of every inline code span."""
        for m in _SPAN.finditer(self.prose):
            yield self.where(self.prose, m.start()), " ".join(m.group(1).split())


def _exists(path: str) -> bool:
    if path in NOT_IN_REPOSITORY:
        return True
    if "/" in path:
        return any((base / path.rstrip("/")).exists() for base in BASES)
    # A bare module name (`filters.py`) names a file of the library or the services, by its directory's context.
    return any(any(base.rglob(path)) for base in BASES[1:])


def _is_path(span: str) -> bool:
    return _PATH.fullmatch(span) is not None and ("/" in span or span.endswith(".py"))


@cache
def _entry_point() -> Callable[[Sequence[str]], object]:
    """The function the `vmsched` script runs, as pyproject.toml declares it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, name = scripts["vmsched"].partition(":")
    fn: Callable[[Sequence[str]], object] = getattr(importlib.import_module(module), name)
    return fn


@cache
def _help(words: tuple[str, ...]) -> tuple[int, str]:
    """`vmsched WORDS --help`: its exit status and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            _entry_point()([*words, "--help"])
        except SystemExit as exc:
            return (exc.code if isinstance(exc.code, int) else 1), out.getvalue()
    return 0, out.getvalue()


def _commands(page: Page) -> Iterator[tuple[str, tuple[str, ...]]]:
    for where, span in page.spans():
        for m in _COMMAND.finditer(span):
            yield where, tuple(w for w in m.groups() if w)
    for m in _FENCED_COMMAND.finditer(page.fenced):
        yield page.where(page.fenced, m.start()), tuple(w for w in m.groups() if w)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in _HEADING.findall(Page(path).prose)}


@pytest.fixture(params=PAGES, ids=_page_id)
def page(request: pytest.FixtureRequest) -> Page:
    return Page(request.param)


def test_paths_in_backticks_exist(page: Page) -> None:
    missing = [f"{where}: `{span}`" for where, span in page.spans() if _is_path(span) and not _exists(span)]
    assert not missing, "paths that do not exist:\n  " + "\n  ".join(missing)


def test_vmsched_commands_exist(page: Page) -> None:
    unknown = []
    for where, words in _commands(page):
        status, said = _help(words)
        if status != 0:
            last = said.strip().splitlines()[-1:] or [""]
            unknown.append(f"{where}: `vmsched {' '.join(words)}` ({last[0]})")
    assert not unknown, "commands `vmsched` does not accept:\n  " + "\n  ".join(unknown)


def test_settings_exist(page: Page) -> None:
    prefix = str(Settings.model_config.get("env_prefix", "")).upper()
    known = {prefix + name.upper() for name in Settings.model_fields}
    known |= {name + "_FILE" for name in known}  # every setting can be read from a file (VariableFileSource)
    known |= set(_SETTING.findall(_help(())[1]))  # what `vmsched --help` documents (VMSCHED_DEBUG)
    named = ((page.where(page.text, m.start()), m.group()) for m in _SETTING.finditer(page.text))
    unknown = [f"{where}: {name}" for where, name in named if name not in known]
    assert not unknown, "VMSCHED_* variables that are not settings:\n  " + "\n  ".join(unknown)


def test_unit_counts_match_the_registry(page: Page) -> None:
    text = " ".join(page.text.split())
    wrong = [m.group() for m in _UNIT_COUNT.finditer(text) if int(m.group(1).replace(",", "")) != len(BUILTIN_UNITS)]
    assert not wrong, f"{_page_id(page.path)}: the registry has {len(BUILTIN_UNITS)} built-in units, not: {wrong}"


def test_some_page_states_the_unit_count() -> None:
    assert any(_UNIT_COUNT.search(" ".join(p.read_text(encoding="utf-8").split())) for p in PAGES)


def test_relative_links_resolve(page: Page) -> None:
    broken = []
    for m in _LINK.finditer(page.prose):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.path.parent / file).resolve() if file else page.path
        where = page.where(page.prose, m.start())
        if not path.exists():
            broken.append(f"{where}: ({target}): no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{where}: ({target}): no heading #{anchor}")
    assert not broken, "links that do not resolve:\n  " + "\n  ".join(broken)


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md: {len(lines)} lines, at most {README_MAX_LINES}"
    assert "make test" in lines, "README.md: the line `make test` (CI runs the README's test command) is gone"
