"""The error tree (vmsched.errors): every exception vmsched defines lives there, with a stable code."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import vmsched
import vmsched.errors as errors
import vmsched_services
from vmsched.errors import InjectionError, InvalidQuery, InvalidRequest, UnsupportedRegex, VmschedError
from vmsched.scheduling.units.extra_specs import check_query, query_passes
from vmsched.scheduling.units.regex_audit import ambiguity


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in (vmsched, vmsched_services):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, BaseException) and obj.__module__ == info.name:
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def test_every_exception_class_is_defined_in_the_error_tree() -> None:
    outside = [f"{c.__module__}.{c.__qualname__}" for c in _exception_classes() if c.__module__ != errors.__name__]
    assert outside == []


def test_every_error_is_listed_with_a_unique_code() -> None:
    classes = [c for c in vars(errors).values() if inspect.isclass(c) and issubclass(c, VmschedError)]
    assert sorted(c.__name__ for c in classes) == sorted(errors.__all__)
    doc = errors.__doc__ or ""
    assert [c.__name__ for c in classes if f" {c.__name__}\n" not in doc and f" {c.__name__} " not in doc] == []
    # A stable code each; PropertyTooLong and GenerationLost share their parent's on purpose (see
    # their docstrings).
    sharing = (errors.PropertyTooLong, errors.GenerationLost)
    codes = [c.code for c in classes if c not in sharing]
    assert len(set(codes)) == len(codes)
    assert all("code" not in vars(c) for c in sharing)


def test_query_regex_and_injection_errors_are_also_builtin_exceptions() -> None:
    # Callers catching ValueError or RuntimeError catch these vmsched errors too.
    assert issubclass(InvalidQuery, ValueError)
    assert issubclass(InvalidQuery, InvalidRequest)
    assert issubclass(UnsupportedRegex, ValueError)
    assert issubclass(InjectionError, RuntimeError)
    with pytest.raises(ValueError, match="unknown operator"):
        check_query(["bogus", 1])
    with pytest.raises(ValueError, match="unknown operator") as info:
        query_passes(["and", ["bogus"]], lambda name: None)
    assert isinstance(info.value, VmschedError)
    assert info.value.code == "invalid_query"
    assert str(info.value).startswith("unknown operator")  # no location prefix: the text is unchanged
    with pytest.raises(ValueError, match="construct"):
        ambiguity(r"^(a)\1$")
