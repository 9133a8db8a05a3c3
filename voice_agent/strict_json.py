"""JSON from clients, read strictly.

RFC 8259 only: no NaN or Infinity, which Python's parser takes (and its
writer writes back) but a browser's JSON.parse and most servers refuse; and
nested at most MAX_DEPTH deep: how deep Python's parser goes depends on the
stack it is called on, so a value it accepted can fail to serialize again
further down the stack (echoed to the client, sent on to the LLM).
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64


class JsonRefused(ValueError):
    pass


def _refuse(constant: str) -> Any:
    raise JsonRefused(f"{constant} is not JSON")


def loads(raw: str | bytes) -> Any:
    """The JSON value in ``raw``; JsonRefused says why there is none."""
    try:
        value = json.loads(raw, parse_constant=_refuse)
    except RecursionError:
        raise JsonRefused(f"nested more than {MAX_DEPTH} deep") from None
    except JsonRefused:
        raise
    except ValueError as exc:  # bad JSON or encoding, an integer of over 4300 digits
        raise JsonRefused(str(exc)) from None
    if depth(value) > MAX_DEPTH:
        raise JsonRefused(f"nested more than {MAX_DEPTH} deep")
    return value


def depth(value: Any) -> int:
    """How deeply arrays and objects nest (a scalar is 0), without recursion."""
    if not isinstance(value, dict | list):
        return 0
    # Level by level, following containers only: most of a large value's
    # elements are scalars, which only say that their level exists.
    deepest, level = 0, [value]
    while level:
        below: list[Any] = []
        populated = False
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            populated = populated or bool(children)
            below.extend(c for c in children if isinstance(c, dict | list))
        if not populated:
            break
        deepest += 1
        if deepest > MAX_DEPTH:
            break  # deep enough to refuse: no need to walk the rest
        level = below
    return deepest
