"""Where a call's ``Location`` points, so its DELETE reaches the process
that owns the call when several replicas sit behind one address.

Without ``--public-url`` a Location is a path (``/v1/realtime/calls/ID``),
resolved against whatever address the offer went to: right for one replica.
With it, the Location is absolute and names this very process (its node's
address, or a per-replica path through an ingress such as
``https://voice.example/pod/voice-agent-0``); the call routes are then also
served under that URL's path, so an ingress can route ``/pod/NAME/`` to a
replica without rewriting paths.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def call_location(public_url: str | None, calls_path: str, call_id: str) -> str:
    return f"{public_url or ''}{calls_path}/{call_id}"


def path_prefix(public_url: str | None) -> str:
    """The path part of ``public_url`` ('' when none or '/')."""
    return urlsplit(public_url).path.rstrip("/") if public_url else ""
