"""Caller metadata from a telephone gateway, into the call's instructions.

A SIP gateway knows who is calling and which number they dialled, and says
so in request headers on the offer: ``X-Caller-Id`` and ``X-Called-Number``.
Both come from the far end's SIP headers (From, the Request-URI), which
anyone can set: they are untrusted. They are cut down to the characters a
phone number or SIP user name has, and reach the LLM only where the
operator's instructions ask for them, with the placeholders
``{caller_id}`` and ``{called_number}``, e.g.
``--llm-instructions "... The caller's number (unverified): {caller_id}."``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

HEADERS = {"X-Caller-Id": "caller_id", "X-Called-Number": "called_number"}
MAX_CHARS = 64
# Digits, +, *, #, and what SIP user names use; nothing that could read as
# an instruction sentence beyond a single token.
UNSAFE = re.compile(r"[^0-9A-Za-z+*#._@-]")
UNKNOWN = "unknown"


def caller_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """The caller metadata in a request's headers, made safe; {} without any."""
    found: dict[str, str] = {}
    for header, name in HEADERS.items():
        value = UNSAFE.sub("", headers.get(header, ""))[:MAX_CHARS]
        if value:
            found[name] = value
    return found


def render_instructions(template: str, metadata: Mapping[str, str]) -> str:
    """The placeholders filled in (``unknown`` for what the gateway did not say).
    Plain replacement, not ``str.format``: other braces stay as written."""
    text = template
    for name in HEADERS.values():
        text = text.replace("{" + name + "}", metadata.get(name, UNKNOWN))
    return text


def with_caller_metadata(
    session: dict[str, Any] | None, headers: Mapping[str, str], default_instructions: str
) -> dict[str, Any] | None:
    """The offer's session configuration, its instructions rendered for this
    caller; unchanged when the instructions have no placeholders."""
    instructions = (session or {}).get("instructions", default_instructions)
    if not isinstance(instructions, str):
        return session  # the session's own validation says what is wrong
    metadata = caller_metadata(headers)
    rendered = render_instructions(instructions, metadata)
    if metadata:
        log.info("caller metadata (untrusted)", extra=metadata)
    if rendered == instructions:
        return session
    return {**(session or {}), "instructions": rendered}
