"""Every error `code` a reply can carry, with what it means: read from the classes of vmsched.errors."""

from __future__ import annotations

from vmsched import errors


def _subclasses(cls: type[errors.VmschedError]) -> list[type[errors.VmschedError]]:
    out: list[type[errors.VmschedError]] = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def error_codes() -> dict[str, str]:
    """Every `code` an ErrorReply (or a decision's ErrorInfo) can carry, with what it means.

    Each exception of vmsched.errors that defines its own `code` defines its `meaning` beside it, so a
    new exception is documented where it is written; one that defines a code without a meaning is
    refused here rather than described by its parent's.
    """
    codes: dict[str, str] = {}
    classes: list[type[errors.VmschedError]] = [errors.VmschedError, *_subclasses(errors.VmschedError)]
    for cls in classes:
        if cls.__module__ != errors.__name__:
            continue  # vmsched raises only the tree's own (a subclass elsewhere is a test's or a tool's)
        code = cls.__dict__.get("code")
        if not isinstance(code, str) or code in codes:
            continue  # a subclass that keeps its parent's code (PropertyTooLong is an invalid_property)
        meaning = cls.__dict__.get("meaning")
        if not isinstance(meaning, str) or not meaning:
            raise TypeError(f"{cls.__qualname__} defines code {code!r} but no meaning of its own")
        codes[code] = meaning
    return dict(sorted(codes.items()))
