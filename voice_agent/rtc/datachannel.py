"""One bad data-channel message must not end the call.

aiortc handles each inbound data-channel message inside its DTLS receive
loop, and an exception there ends the whole transport: the data channel
and, bundled on it, the call's audio. A text message that is not UTF-8
raises UnicodeDecodeError there (``data.decode("utf8")``), and so do a
channel-open request with such a label and the ``assert`` on an open for a
stream already open. Installed once (process-wide, like the ICE address
pinning in call.py), this hands a text message that is not UTF-8 on as
bytes, which the Realtime protocol answers with an ``invalid_json`` error,
and drops (with a warning) a control message aiortc cannot take.
"""

from __future__ import annotations

import logging

from aiortc.rtcsctptransport import WEBRTC_STRING, RTCSctpTransport

from voice_agent.rtc import internals

log = logging.getLogger(__name__)

_aiortc_receive = RTCSctpTransport._data_channel_receive


async def _receive(transport: RTCSctpTransport, stream_id: int, pp_id: int, data: bytes) -> None:
    channel = transport._data_channels.get(stream_id)
    if pp_id == WEBRTC_STRING and channel is not None:
        try:
            text = data.decode("utf8")
        except UnicodeDecodeError:
            channel.emit("message", data)  # as bytes: the protocol refuses it
            return
        channel.emit("message", text)
        return
    try:
        await _aiortc_receive(transport, stream_id, pp_id, data)
    except (UnicodeDecodeError, AssertionError):  # raised before aiortc changes anything
        log.warning(
            "data-channel control message dropped",
            exc_info=True,
            extra={"stream_id": stream_id, "pp_id": pp_id},
        )


def contain_bad_messages() -> None:
    """Install the wrapper (idempotent)."""
    if not internals.patchable("data channel receive"):
        return
    RTCSctpTransport._data_channel_receive = _receive  # type: ignore[method-assign, assignment]
