"""The layer contract ([tool.importlinter] in pyproject.toml): no module imports from a layer above its own.

`make lint` runs lint-imports too; this runs the same contract so the test suite fails on a violation
with import-linter's report (which import, on which line) in the failure.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# lint-imports' own entry point, run by this interpreter so it sees the same vmsched as the tests do.
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    run = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo", "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_layer_contract_has_no_exceptions() -> None:
    # An import against the layers is fixed by moving code; an ignore list would let them pile up.
    contracts = _contracts()
    assert [c["type"] for c in contracts] == ["layers"]
    assert all("ignore_imports" not in c and "unmatched_ignore_imports_alerting" not in c for c in contracts)
    layers = contracts[0]["layers"]
    assert layers[0] == "vmsched_services"
    # The foundation: settings, logging and metrics above what they may name (constants, errors).
    assert layers[-2:] == ["vmsched.settings | vmsched.logging | vmsched.metrics", "vmsched.constants | vmsched.errors"]
