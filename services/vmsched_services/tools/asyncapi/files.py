"""contracts/ on disk: render every file, write the ones that changed, or list the ones that differ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vmsched_services.tools.asyncapi.catalogue import message_schemas
from vmsched_services.tools.asyncapi.document import asyncapi


def render() -> dict[str, str]:
    """Relative path -> file content, for everything under contracts/: the AsyncAPI document, the
    message schemas, and the HTTP API's OpenAPI document (keys sorted: a stable diff)."""
    files = {"asyncapi.json": _dump(asyncapi())}
    for name, schema in message_schemas().items():
        files[f"schemas/{name}.json"] = _dump(schema)
    files["openapi.json"] = json.dumps(openapi(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return files


def openapi() -> dict[str, Any]:
    """The api service's OpenAPI 3.1 document, as its app serves it at /api/v1/openapi.json."""
    from vmsched.settings import Settings  # noqa: PLC0415 - the app (FastAPI) only when contracts are rendered
    from vmsched_services.api.app import create_app  # noqa: PLC0415

    # Settings with nothing read from the environment: the document must not depend on where it is made.
    doc: dict[str, Any] = create_app(Settings.model_construct()).openapi()
    return doc


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def write(root: Path) -> list[str]:
    """Write contracts/ under `root`; return the files that changed."""
    changed = []
    for rel, content in render().items():
        path = root / rel
        if not path.exists() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            changed.append(rel)
    return changed


def check(root: Path) -> list[str]:
    """Files under `root` that differ from what the models generate (missing, stale or extra)."""
    expected = render()
    problems = [
        rel for rel, content in expected.items() if not (root / rel).exists() or (root / rel).read_text() != content
    ]
    if root.exists():
        present = {str(p.relative_to(root)) for p in root.rglob("*.json")}
        problems += sorted(present - set(expected))
    return problems
