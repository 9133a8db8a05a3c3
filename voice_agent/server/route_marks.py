"""A mark on route handlers that authenticate their caller themselves, so
the key check in front of every other route (``server/access.py``) lets
them decide: they take client secrets, or a call's maker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_OWN_CHECK = "_checks_its_own_caller"

H = TypeVar("H", bound=Callable[..., Any])


def checks_its_own_caller(handler: H) -> H:
    setattr(handler, _OWN_CHECK, True)
    return handler


def checks_own_caller(handler: object) -> bool:
    return bool(getattr(handler, _OWN_CHECK, False))
