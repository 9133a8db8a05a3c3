"""What a broken or hostile WebRTC peer can send that aiortc's own API will
not: text messages that are not UTF-8, messages over the advertised size,
malformed channel-open requests. Reaches into aiortc's SCTP transport on
the client side only; the server under test is untouched."""

from __future__ import annotations

from struct import pack

from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.rtcsctptransport import DATA_CHANNEL_OPEN, WEBRTC_DCEP, WEBRTC_STRING


async def send_as_text(channel: RTCDataChannel, data: bytes) -> None:
    """Send ``data`` under the text (UTF-8) payload type whatever its bytes
    are: aiortc's own send() only sends valid text."""
    if not data:  # an empty message has its own payload type (and one byte)
        channel.send("")
        return
    transport = channel.transport
    channel._addBufferedAmount(len(data))
    transport._data_channel_queue.append((channel, WEBRTC_STRING, data))
    await transport._data_channel_flush()


def ignore_max_message_size(pc: RTCPeerConnection) -> None:
    """Send messages larger than the other side advertised it accepts."""
    sctp = pc.sctp
    assert sctp is not None
    sctp._remote_max_message_size = 0


async def send_channel_open(channel: RTCDataChannel, stream_id: int, label: bytes) -> None:
    """A channel-open request (RFC 8832) on ``stream_id`` with a raw label."""
    request = pack("!BBHLHH", DATA_CHANNEL_OPEN, 0, 0, 0, len(label), 0) + label
    await channel.transport._send(stream_id, WEBRTC_DCEP, request)
