"""The web console: server-rendered pages with a little plain JavaScript, served by the api service."""

from __future__ import annotations

from fastapi import APIRouter


def console_router() -> APIRouter:
    """The console's pages (under /console) and its static assets."""
    return APIRouter(prefix="/console")


__all__ = ["console_router"]
