"""Hypothesis strategies for what a client can send: mutated SDP offers,
broken multipart bodies, odd content types, methods and call ids, malformed
JSON bodies and data-channel messages; with, where it is clear from the
input alone, what the server must answer."""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

Json = Any

# -- SDP offers ------------------------------------------------------------------
# Tokens that mean something somewhere in an offer, and the edges of numbers.
SDP_TOKENS = [
    "", "0", "-1", "65535", "65536", "4294967296", "99999999999999999999", "IN", "IP4",
    "IP6", "::1", "0.0.0.0", "256.1.1.1", "x.local", "typ", "host", "srflx", "relay", "udp",
    "tcp", "UDP/TLS/RTP/SAVPF", "UDP/DTLS/SCTP", "webrtc-datachannel", "sha-256", "sha-1",
    "md5", "AB:CD", "actpass", "active", "passive", "sendrecv", "inactive", "opus/48000/2",
    "111", "127", "72", "BUNDLE", "\x00", "%", "é", "☃",
]  # fmt: skip
sdp_tokens = st.one_of(
    st.sampled_from(SDP_TOKENS),
    st.text(max_size=12),
    st.integers(-(2**40), 2**40).map(str),
)

# One change to the offer's lines: (operation, line index, argument).
Mutation = tuple[str, int, Any]


def sdp_mutations(line_count: int) -> st.SearchStrategy[Mutation]:
    index = st.integers(0, max(0, line_count - 1))
    return st.one_of(
        st.tuples(st.just("drop"), index, st.none()),
        st.tuples(st.just("duplicate"), index, st.none()),
        st.tuples(st.just("swap"), index, index),
        st.tuples(st.just("truncate"), index, st.integers(0, 80)),
        st.tuples(st.just("garble"), index, st.tuples(st.integers(0, 10), sdp_tokens)),
        st.tuples(st.just("insert_bytes"), index, st.binary(min_size=1, max_size=24)),
        st.tuples(st.just("insert_line"), index, st.text(max_size=40)),
    )


def _garble(line: bytes, token: int, value: str) -> bytes:
    """Replace one space-separated token of a line's value."""
    tokens = line.split(b" ")
    at = token % len(tokens)
    replacement = value.encode("utf-8", "surrogatepass")
    if at == 0:
        # Keep "a=name:" (or "x=") so the line is still what it claims to be.
        head = tokens[0]
        cut = head.find(b":") + 1 or head.find(b"=") + 1
        tokens[0] = head[:cut] + replacement
    else:
        tokens[at] = replacement
    return b" ".join(tokens)


def mutate_offer(offer: str, mutations: list[Mutation], newline: bytes) -> bytes:
    lines = [line.encode() for line in offer.split("\r\n")]
    for operation, index, argument in mutations:
        if not lines:
            break
        at = index % len(lines)
        if operation == "drop":
            del lines[at]
        elif operation == "duplicate":
            lines.insert(at, lines[at])
        elif operation == "swap":
            other = argument % len(lines)
            lines[at], lines[other] = lines[other], lines[at]
        elif operation == "truncate":
            lines[at] = lines[at][: argument % (len(lines[at]) + 1)]
        elif operation == "garble":
            token, value = argument
            lines[at] = _garble(lines[at], token, value)
        elif operation == "insert_bytes":
            middle = len(lines[at]) // 2
            lines[at] = lines[at][:middle] + argument + lines[at][middle:]
        elif operation == "insert_line":
            lines.insert(at, argument.encode("utf-8", "surrogatepass"))
    return newline.join(lines)


def mutated_offers(offer: str) -> st.SearchStrategy[bytes]:
    line_count = offer.count("\r\n") + 1
    return st.builds(
        mutate_offer,
        st.just(offer),
        st.lists(sdp_mutations(line_count), min_size=1, max_size=5),
        st.sampled_from([b"\r\n", b"\n"]),
    )


# -- JSON ------------------------------------------------------------------------
texts = st.one_of(
    st.text(max_size=20),
    st.text(st.characters(categories=["Cs", "Co", "Cc"]), max_size=4),  # surrogates, controls
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),  # NaN and infinities included: json.dumps writes them, strict JSON has none
    texts,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=16,
)


def nested(depth: int, kind: str) -> str:
    """``depth`` levels of arrays or objects around a number."""
    if kind == "array":
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def json_depth(value: Json) -> int:
    """Nesting depth (a scalar is 0), without recursion: deep input is the point."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parses_strictly(raw: str | bytes) -> tuple[bool, Json]:
    """(True, value) when ``raw`` is JSON by RFC 8259: no NaN or Infinity, and
    not nested so deeply that Python's parser gives up."""

    def refuse(constant: str) -> float:
        raise ValueError(constant)

    try:
        return True, json.loads(raw, parse_constant=refuse)
    except (ValueError, RecursionError):
        return False, None


def text_mutations(text: str) -> st.SearchStrategy[str]:
    """The text cut short, with a character dropped, or with junk inserted."""
    position = st.integers(0, len(text))
    return st.one_of(
        position.map(lambda at: text[:at]),
        position.map(lambda at: text[:at] + text[at + 1 :]),
        st.tuples(position, st.text(min_size=1, max_size=4)).map(
            lambda pair: text[: pair[0]] + pair[1] + text[pair[0] :]
        ),
    )


def _dumps(value: Json) -> str:
    return json.dumps(value)


# -- LLM proxy bodies -----------------------------------------------------------------
chat_fields = st.fixed_dictionaries(
    {},
    optional={
        "model": json_values,
        "messages": json_values
        | st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | json_values},
                optional={"content": json_values},
            ),
            max_size=3,
        ),
        "input": json_values,
        "stream": json_values,
        "max_tokens": json_values,
        "tools": json_values,
        "temperature": json_values,
    },
)
proxy_bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(_dumps).map(str.encode),
    chat_fields.map(_dumps).map(str.encode),
    chat_fields.map(_dumps).flatmap(text_mutations).map(lambda t: t.encode("utf-8", "replace")),
    st.builds(nested, st.integers(1, 3000), st.sampled_from(["array", "object"])).map(str.encode),
    st.builds(
        lambda depth, kind: f'{{"messages": [], "tools": {nested(depth, kind)}}}'.encode(),
        st.integers(1, 3000),
        st.sampled_from(["array", "object"]),
    ),
    st.integers(3000, 6000).map(lambda size: b'{"input": "' + b"x" * size + b'"}'),
)

# -- HTTP surface ------------------------------------------------------------------
printable_ascii = st.text(
    st.characters(min_codepoint=32, max_codepoint=126), max_size=40
)  # what a header value may hold
content_types = st.one_of(
    st.none(),  # no Content-Type header at all
    st.sampled_from(
        [
            "application/sdp",
            "APPLICATION/SDP",
            "application/sdp; charset=utf-8",
            "application/sdp; charset=latin-1",
            "text/plain",
            "application/json",
            "application/octet-stream",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/mixed; boundary=x",
            "",
            "*/*",
            ";;",
            "/",
            "application/",
            "a/b/c",
        ]
    ),
    printable_ascii,
)
TOKEN_CHARS = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
# Methods aiohttp's HTTP parser (llhttp) knows; any other is refused by the
# parser itself, 400 in plain text, before the application sees a request.
PARSED_METHODS = [
    "GET", "PUT", "PATCH", "DELETE", "POST", "HEAD", "OPTIONS", "TRACE", "PROPFIND",
    "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK", "SEARCH", "REPORT", "MERGE",
    "M-SEARCH", "NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE", "PURGE", "LINK", "UNLINK", "QUERY",
]  # fmt: skip
methods = st.one_of(
    st.sampled_from(PARSED_METHODS),
    st.text(st.sampled_from(TOKEN_CHARS), min_size=1, max_size=10),
)
call_ids = st.one_of(
    st.sampled_from(["rtc_nope", "", ".", "..", "%00", "%2F", "rtc_" + "a" * 300, "😀", "a%zz"]),
    st.text(max_size=40),
)
path_tails = st.sampled_from(["", "/", "/x", "/x/y", "?a=b", "?" + "q" * 100, "#f", ";p"])

# -- multipart ------------------------------------------------------------------------
boundaries = st.one_of(
    st.sampled_from(["x", "----WebKitFormBoundary7MA4YWxkTrZu0gW", "a b", "--", "=", "é"]),
    st.text(st.sampled_from(TOKEN_CHARS), min_size=1, max_size=70),
)
part_names = st.one_of(st.sampled_from(["sdp", "session", "file", ""]), st.text(max_size=8))


def session_parts() -> st.SearchStrategy[bytes]:
    return st.one_of(
        json_values.map(_dumps).map(str.encode),
        st.just(b'{"type": "realtime", "instructions": "Be brief."}'),
        st.builds(
            lambda depth: (
                f'{{"tools": [{{"name": "f", "parameters": {nested(depth, "object")}}}]}}'.encode()
            ),
            st.integers(1, 3000),
        ),
        st.binary(max_size=40),
    )


@st.composite
def multipart_bodies(draw: st.DrawFn, offer: str) -> tuple[bytes, str]:
    """A multipart body (often broken after it is built) and its Content-Type."""
    boundary = draw(boundaries)
    parts: list[tuple[str, bytes]] = []
    for _ in range(draw(st.integers(0, 3))):
        name = draw(part_names)
        if name == "sdp" or draw(st.booleans()):
            data = draw(st.one_of(st.just(offer.encode()), mutated_offers(offer)))
        else:
            data = draw(session_parts())
        parts.append((name, data))
    chunks = []
    for name, data in parts:
        disposition = draw(
            st.sampled_from(
                [
                    f'form-data; name="{name}"',
                    f"form-data; name={name}",
                    "form-data",
                    f'attachment; filename="{name}"',
                    "",
                ]
            )
        )
        chunks.append(
            f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode("utf-8", "replace")
            + data
            + b"\r\n"
        )
    body = b"".join(chunks) + f"--{boundary}--\r\n".encode("utf-8", "replace")
    # Then, sometimes, break it: cut it short or splice junk in.
    breakage = draw(st.sampled_from(["none", "truncate", "splice"]))
    at = draw(st.integers(0, len(body)))
    if breakage == "truncate":
        body = body[:at]
    elif breakage == "splice":
        body = body[:at] + draw(st.binary(min_size=1, max_size=16)) + body[at:]
    content_type = draw(
        st.sampled_from(
            [
                f"multipart/form-data; boundary={boundary}",
                f'multipart/form-data; boundary="{boundary}"',
                "multipart/form-data",
                f"multipart/form-data; boundary={boundary}x",
                f"multipart/mixed; boundary={boundary}",
            ]
        )
    )
    return body, content_type


# -- data-channel messages -----------------------------------------------------------
# Client events answered at once: by this event, or by an error.
ACKNOWLEDGED_BY = {
    "session.update": "session.updated",
    "conversation.item.create": "conversation.item.added",
}
KNOWN_EVENT_TYPES = [
    "session.update",
    "response.cancel",
    "output_audio_buffer.clear",
    "conversation.item.create",
    "response.create",
]
MAX_EVENT_BYTES = 256 * 1024

Expect = Literal["invalid_json", "invalid_event", "unknown_event", "event_too_large", "handled"]


@dataclass(frozen=True)
class Message:
    """One data-channel message as sent: text, binary, or bytes under the
    text payload type (whatever their encoding, as a broken peer may send)."""

    kind: Literal["text", "binary", "text_bytes"]
    payload: str | bytes

    @property
    def size(self) -> int:
        return len(self.payload)

    @property
    def event_type(self) -> str | None:
        """The type of a well-formed event, else None."""
        ok, value = parses_strictly(self.payload)
        kind = value.get("type") if ok and isinstance(value, dict) else None
        return kind if isinstance(kind, str) else None

    def expected(self) -> Expect | None:
        """The error code the server must answer with, "handled" for an event
        it knows (which may succeed or fail), or None where the input alone
        does not say (nested past any parser's patience)."""
        if self.size > MAX_EVENT_BYTES:
            return "event_too_large"
        raw = self.payload
        if self.kind == "text_bytes":
            assert isinstance(raw, bytes)
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                return "invalid_json"
        ok, value = parses_strictly(raw)
        if not ok:
            return "invalid_json"
        if json_depth(value) > 32:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            return "invalid_event"
        if value["type"] not in KNOWN_EVENT_TYPES:
            return "unknown_event"
        return "handled"


def _event(kind: str, fields: dict[str, Json]) -> str:
    return json.dumps({"type": kind, **fields})


known_events = st.builds(
    _event,
    st.sampled_from(KNOWN_EVENT_TYPES),
    st.fixed_dictionaries(
        {},
        optional={
            "event_id": json_values,
            "session": json_values
            | st.fixed_dictionaries(
                {},
                optional={
                    "instructions": json_values,
                    "tools": json_values,
                    "tool_choice": json_values
                    | st.sampled_from(["auto", "none", "required", {"type": "function"}]),
                    "max_output_tokens": json_values | st.sampled_from(["inf", 1, 4096, 4097]),
                    "audio": json_values
                    | st.builds(
                        lambda v: {"input": {"turn_detection": {"silence_duration_ms": v}}},
                        json_values | st.integers(0, 6000),
                    ),
                    "turn_detection": json_values,
                },
            ),
            "item": json_values
            | st.fixed_dictionaries(
                {"type": st.sampled_from(["message", "function_call_output"]) | json_values},
                optional={
                    "role": st.sampled_from(["user", "assistant"]) | json_values,
                    "content": json_values
                    | st.lists(
                        st.fixed_dictionaries(
                            {"type": st.just("input_text") | json_values},
                            optional={"text": json_values},
                        ),
                        max_size=2,
                    ),
                    "call_id": json_values,
                    "output": json_values,
                    "id": json_values,
                },
            ),
            "response": json_values
            | st.fixed_dictionaries(
                {},
                optional={"instructions": json_values, "max_output_tokens": json_values},
            ),
        },
    ),
)


def _padded_event(size: int) -> str:
    """A session.update of exactly ``size`` characters (instructions padding)."""
    head, tail = '{"type": "session.update", "session": {"instructions": "', '"}}'
    return head + "x" * max(0, size - len(head) - len(tail)) + tail


def _deep_event(depth: int, kind: str, where: str) -> str:
    core = nested(depth, kind)
    if where == "tools":
        return (
            '{"type": "session.update", "session": {"tools": '
            f'[{{"type": "function", "name": "f", "parameters": {core}}}]}}}}'
        )
    if where == "item":
        return f'{{"type": "conversation.item.create", "item": {core}}}'
    return core


def text_message(text: str) -> Message:
    """Text as a text message; with lone surrogates (no UTF-8 has them) as
    the bytes a broken peer would send for it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return Message("text_bytes", text.encode("utf-8", "surrogatepass"))
    return Message("text", text)


messages = st.one_of(
    st.builds(Message, st.just("text"), json_values.map(_dumps)),
    texts.map(text_message),
    st.builds(Message, st.just("text"), known_events),
    st.builds(Message, st.just("text"), known_events.flatmap(text_mutations)),
    st.builds(
        Message,
        st.just("text"),
        st.builds(
            _event,
            st.text(max_size=30) | st.sampled_from(["SESSION.UPDATE", "session.update "]),
            st.just({}),
        ),
    ),
    st.builds(Message, st.just("binary"), st.binary(max_size=64)),
    st.builds(Message, st.just("binary"), known_events.map(str.encode)),
    st.builds(Message, st.just("text_bytes"), st.binary(max_size=64)),
    st.builds(
        Message,
        st.just("text"),
        st.builds(
            _deep_event,
            st.integers(1, 3000),
            st.sampled_from(["array", "object"]),
            st.sampled_from(["tools", "item", "bare"]),
        ),
    ),
    st.builds(
        Message,
        st.just("text"),
        st.one_of(  # about the limit, and the limit itself
            st.sampled_from([MAX_EVENT_BYTES - 1, MAX_EVENT_BYTES, MAX_EVENT_BYTES + 1]),
            st.integers(MAX_EVENT_BYTES - 1024, MAX_EVENT_BYTES + 1024),
        ).map(_padded_event),
    ),
)
