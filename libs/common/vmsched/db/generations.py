"""The durable generation counter per cluster (vmsched.store.generations says what it orders).

A cluster seen for the first time starts at generation 0, whose stamps are the plain counters
(versions 1, 2, ... as before generations existed, so an upgrade changes no counter); each loss
found advances it by one.

A generation is only ever advanced, in one statement, so two services that find the same loss at
once get two different, increasing generations (the marker keeps the newer one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# asyncpg ships no type information.
Pool = Any

_ADVANCE = """
INSERT INTO redis_generation AS g (redis_prefix, cluster_id, generation) VALUES ($1, $2, 0)
ON CONFLICT (redis_prefix, cluster_id) DO UPDATE SET generation = g.generation + 1, started_at = now()
RETURNING generation, (xmax = 0) AS inserted
"""


@dataclass(frozen=True)
class Advanced:
    """A cluster's new generation; `known` when it had one before (so Redis forgot it)."""

    generation: int
    known: bool


class GenerationLedger:
    """Reads and advances the generations of one Redis namespace (the key prefix) in PostgreSQL."""

    def __init__(self, pool: Pool, redis_prefix: str) -> None:
        self._pool = pool
        self._prefix = redis_prefix

    async def advance(self, cluster_id: str) -> Advanced:
        row = await self._pool.fetchrow(_ADVANCE, self._prefix, cluster_id)
        return Advanced(int(row["generation"]), known=not row["inserted"])

    async def lost(self) -> list[str]:
        """Every cluster Redis ever forgot (a generation past the first): the only ones that can be
        waiting for a full report."""
        rows = await self._pool.fetch(
            "SELECT cluster_id FROM redis_generation WHERE redis_prefix = $1 AND generation > 0 ORDER BY 1",
            self._prefix,
        )
        return [str(r["cluster_id"]) for r in rows]

    async def current(self, cluster_id: str) -> int | None:
        value = await self._pool.fetchval(
            "SELECT generation FROM redis_generation WHERE redis_prefix = $1 AND cluster_id = $2",
            self._prefix,
            cluster_id,
        )
        return None if value is None else int(value)


__all__ = ["Advanced", "GenerationLedger"]
