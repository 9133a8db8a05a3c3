"""rtpengine's NG control protocol: bencoded dictionaries over UDP.

The gateway asks rtpengine for each call's two SDP rewrites itself (offer:
the phone's RTP/AVP into ICE + DTLS-SRTP for the service; answer: the
service's answer back into RTP/AVP for the phone), with the SDPs in hand,
instead of through Kamailio's rtpengine module, whose answer is made from a
SIP reply that in this gateway does not exist (the service answers over HTTP).
"""

from __future__ import annotations

import os
import socket
from typing import Any

TIMEOUT_S = 2.0
RETRIES = 2


class NgError(Exception):
    pass


def encode(value: Any) -> bytes:
    if isinstance(value, bytes):
        return b"%d:%s" % (len(value), value)
    if isinstance(value, str):
        return encode(value.encode())
    if isinstance(value, bool):
        return encode(str(value).lower())
    if isinstance(value, int):
        return b"i%de" % value
    if isinstance(value, (list, tuple)):
        return b"l" + b"".join(encode(item) for item in value) + b"e"
    if isinstance(value, dict):
        items = sorted((k.encode() if isinstance(k, str) else k, v) for k, v in value.items())
        return b"d" + b"".join(encode(k) + encode(v) for k, v in items) + b"e"
    raise TypeError(f"cannot bencode {type(value).__name__}")


def decode(data: bytes) -> Any:
    value, end = _decode(data, 0)
    if end != len(data):
        raise NgError("trailing bytes after the bencoded reply")
    return value


def _decode(data: bytes, at: int) -> tuple[Any, int]:
    kind = data[at : at + 1]
    if kind == b"i":
        end = data.index(b"e", at)
        return int(data[at + 1 : end]), end + 1
    if kind == b"l":
        items, at = [], at + 1
        while data[at : at + 1] != b"e":
            item, at = _decode(data, at)
            items.append(item)
        return items, at + 1
    if kind == b"d":
        result, at = {}, at + 1
        while data[at : at + 1] != b"e":
            key, at = _decode(data, at)
            result[key], at = _decode(data, at)
        return result, at + 1
    colon = data.index(b":", at)
    length = int(data[at:colon])
    start = colon + 1
    return data[start : start + length].decode(errors="replace"), start + length


def command(address: tuple[str, int], request: dict[str, Any]) -> dict[str, Any]:
    """Send one NG command; its reply (raises NgError unless result is ok)."""
    cookie = os.urandom(8).hex().encode()
    message = cookie + b" " + encode(request)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.connect(address)
        for _ in range(RETRIES + 1):
            sock.send(message)
            try:
                while True:
                    reply = sock.recv(65536)
                    if reply.startswith(cookie + b" "):
                        break
            except TimeoutError:
                continue
            answer: dict[str, Any] = decode(reply[len(cookie) + 1 :])
            if answer.get("result") not in ("ok", "pong"):
                raise NgError(
                    f"rtpengine {request['command']}: {answer.get('error-reason', answer)}"
                )
            return answer
    raise NgError(f"rtpengine did not answer {request['command']} within {TIMEOUT_S:g} s")
