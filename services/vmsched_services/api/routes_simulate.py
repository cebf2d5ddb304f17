"""Simulations: vmsched's simulator on a small generated workload, two policies side by side."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["simulations"])

__all__ = ["router"]
