"""The SDP of offers within a call, as text: its direction, its formats,
its media address and its version (RFC 3264), and the answer a re-offer
gets from the one given at set-up. Plain Python: deploy/sip/dialogs.py
uses it inside Kamailio, the tests without."""

from __future__ import annotations

DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
# The answer's direction for each offered one (RFC 3264 section 6.1).
COMPLEMENT = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
HELD = ("sendonly", "inactive")  # the caller does not want to hear the agent
SENDING = ("sendrecv", "sendonly")  # the caller will send audio
# Formats with fixed payload types (RFC 3551) that a trunk may list without rtpmap.
STATIC_FORMATS = {
    "0": "pcmu/8000",
    "3": "gsm/8000",
    "4": "g723/8000",
    "8": "pcma/8000",
    "9": "g722/8000",
    "18": "g729/8000",
}
TELEPHONE_EVENT = "telephone-event/8000"


def sections(sdp: str) -> tuple[list[str], list[list[str]]]:
    """An SDP's session-level lines and its media sections (each from its m= line)."""
    session: list[str] = []
    media: list[list[str]] = []
    for line in sdp.splitlines():
        if not line.strip():
            continue
        if line.startswith("m="):
            media.append([line])
        elif media:
            media[-1].append(line)
        else:
            session.append(line)
    return session, media


def joined(session: list[str], media: list[list[str]]) -> str:
    return "".join(line + "\r\n" for line in session + [line for part in media for line in part])


def normalized(sdp: str) -> str:
    """One form for every SDP kept or compared: CRLF lines, no blank ones."""
    return joined(*sections(sdp))


def audio_of(media: list[list[str]]) -> list[str] | None:
    return next((part for part in media if part[0].startswith("m=audio ")), None)


def direction_of(sdp: str) -> str:
    """The direction an offer asks for its audio: the media's own attribute,
    else the session's, else sendrecv; a connection address of 0.0.0.0 (the
    hold of RFC 2543) means it does not want to receive."""
    session, media = sections(sdp)
    audio = audio_of(media) or []
    direction = "sendrecv"
    for line in session + audio[1:]:  # the media's own attribute comes last and wins
        if is_direction(line):
            direction = line[2:].strip()
    if connection_of(session, audio) == "0.0.0.0":
        direction = {"sendrecv": "sendonly", "recvonly": "inactive"}.get(direction, direction)
    return direction


def is_direction(line: str) -> bool:
    return line.startswith("a=") and line[2:].strip() in DIRECTIONS


def connection_of(session: list[str], audio: list[str]) -> str:
    """The audio's connection address (its own c= line, else the session's)."""
    for lines in (audio, session):
        for line in lines:
            if line.startswith("c="):
                fields = line[2:].split()
                return fields[2].split("/")[0] if len(fields) >= 3 else ""
    return ""


def media_target(sdp: str) -> tuple[str, int] | None:
    """Where the phone wants its audio: address and port (None: no audio)."""
    session, media = sections(sdp)
    audio = audio_of(media)
    if audio is None:
        return None
    fields = audio[0].split()
    port_text = fields[1].split("/")[0] if len(fields) > 1 else ""
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"no port in the SDP's audio line: {audio[0][:80]!r}")
    port = int(port_text)
    return connection_of(session, audio), port


def moved(first: tuple[str, int], offer: tuple[str, int]) -> bool:
    """Whether an offer sends the audio elsewhere than the first offer did
    (0.0.0.0 is hold, not a move)."""
    address, port = offer
    return port != first[1] or address not in (first[0], "0.0.0.0")


def with_direction(sdp: str, direction: str) -> str:
    """The SDP with its audio's direction set (a session-level one dropped)."""
    session, media = sections(sdp)
    session = [line for line in session if not is_direction(line)]
    audio = audio_of(media)
    if audio is not None:
        at = next((i for i, line in enumerate(audio) if is_direction(line)), None)
        if at is None:
            audio.append(f"a={direction}")
        else:
            audio[at] = f"a={direction}"
    return joined(session, media)


def formats_of(audio: list[str]) -> list[tuple[str, str]]:
    """An audio section's formats, in order: (payload type, "name/rate"), lower case."""
    names: dict[str, str] = {}
    for line in audio[1:]:
        if line.startswith("a=rtpmap:"):
            payload, _, encoding = line[len("a=rtpmap:") :].partition(" ")
            names[payload.strip()] = "/".join(encoding.strip().lower().split("/")[:2])
    return [
        (payload, names.get(payload, STATIC_FORMATS.get(payload, "")))
        for payload in audio[0].split()[3:]
    ]


def codec_of(sdp: str) -> tuple[str, str] | None:
    """The call's codec in an answer: its first audio format that is no
    telephone-event."""
    audio = audio_of(sections(sdp)[1])
    formats = formats_of(audio) if audio else []
    return next((format_ for format_ in formats if format_[1] != TELEPHONE_EVENT), None)


def restricted_to(answer: str, offer: str) -> str | None:
    """The answer with only the formats the offer lists too (same payload
    type, same encoding); None when the call's codec is not among them."""
    session, media = sections(answer)
    audio, offered_audio = audio_of(media), audio_of(sections(offer)[1])
    codec = codec_of(answer)
    if audio is None or offered_audio is None or codec is None:
        return None
    offered = set(formats_of(offered_audio))
    if codec not in offered:
        return None
    kept = [payload for payload, name in formats_of(audio) if (payload, name) in offered]
    dropped = {payload for payload, _ in formats_of(audio)} - set(kept)
    fields = audio[0].split()
    audio[0] = " ".join(fields[:3] + kept)
    audio[1:] = [line for line in audio[1:] if format_line_of(line) not in dropped]
    return joined(session, media)


def format_line_of(line: str) -> str | None:
    """The payload type an a=rtpmap/fmtp/rtcp-fb line is about."""
    for prefix in ("a=rtpmap:", "a=fmtp:", "a=rtcp-fb:"):
        if line.startswith(prefix):
            return line[len(prefix) :].split(" ", 1)[0]
    return None


def origin_of(sdp: str) -> str:
    return next((line for line in sections(sdp)[0] if line.startswith("o=")), "")


def with_origin(sdp: str, origin: str) -> str:
    session, media = sections(sdp)
    return joined([origin if line.startswith("o=") else line for line in session], media)


def with_next_version(sdp: str) -> str:
    """The SDP with its o= line's session version one up (RFC 3264 section 8)."""
    fields = origin_of(sdp)[2:].split()
    if len(fields) < 6 or not fields[2].isdigit():
        return sdp
    fields[2] = str(int(fields[2]) + 1)
    return with_origin(sdp, "o=" + " ".join(fields))


def next_answer(first: str, last: str, offer: str) -> str | None:
    """The answer to an offer within the call: the first answer, narrowed to
    what the offer lists, with the direction that complements the offer's;
    the last answer's version, one up if anything changed. None: the offer
    leaves out the call's codec (488)."""
    answer = restricted_to(first, offer)
    if answer is None:
        return None
    answer = with_direction(answer, COMPLEMENT[direction_of(offer)])
    last = normalized(last)
    answer = with_origin(answer, origin_of(last))
    return last if answer == last else with_next_version(answer)
