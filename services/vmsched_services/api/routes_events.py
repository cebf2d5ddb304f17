"""Server-sent events: what vmsched says about the clusters, as it says it."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["events"])

__all__ = ["router"]
