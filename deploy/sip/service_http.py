"""The service's HTTP API as the gateway calls it: where it is, its key, one
request at a time (Kamailio's http_client cannot read response headers, and
a call's Location names it for the DELETE), and its refusals as SIP answers.

Settings come from the environment (see run-gateway).
"""

from __future__ import annotations

import http.client
import os
import urllib.parse

SERVICE = urllib.parse.urlsplit(os.environ.get("VOICE_AGENT_URL", "http://127.0.0.1:8080"))
API_KEY = os.environ.get("VOICE_AGENT_API_KEY", "")
HTTP_TIMEOUT_S = float(os.environ.get("VOICE_AGENT_TIMEOUT_S", "15"))
CALLS_PATH = SERVICE.path.rstrip("/") + "/v1/realtime/calls"

# The service's refusals, as SIP answers to the caller.
SIP_FOR_HTTP = {
    400: (488, "Not Acceptable Here"),
    401: (403, "Forbidden"),
    403: (403, "Forbidden"),
    413: (488, "Not Acceptable Here"),
    429: (503, "Service Unavailable"),
    503: (503, "Service Unavailable"),
}


def http_request(
    method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """One request to the service: status, headers, body (raises OSError)."""
    connection_type = (
        http.client.HTTPSConnection if SERVICE.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_type(SERVICE.netloc, timeout=HTTP_TIMEOUT_S)
    try:
        sent = dict(headers or {})
        if API_KEY:
            sent["Authorization"] = f"Bearer {API_KEY}"
        connection.request(method, path, body=body.encode() if body else None, headers=sent)
        response = connection.getresponse()
        return (
            response.status,
            dict(response.getheaders()),
            response.read().decode(errors="replace"),
        )
    finally:
        connection.close()
