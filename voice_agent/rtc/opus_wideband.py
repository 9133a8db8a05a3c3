"""The caller's Opus audio decoded straight to 16 kHz mono, what the VAD
and the STT take.

aiortc decodes Opus through FFmpeg, which always gives 48 kHz (and aiortc
asks for stereo); the session then down-mixes it and decimates it by three.
libopus itself decodes at 16 kHz, to mono, in one step: measured on 20 ms
packets, 43 µs a packet against 139 µs for decoding, down-mixing and
decimating, fifty times a second for every call, idle or not.

The libopus used is the one PyAV ships (``av.libs``, the copy FFmpeg
already loaded), else the system's, called through ctypes; with neither
``available()`` is False and the caller's audio takes aiortc's own
decoder.

An empty payload (a packet of padding only, which aiortc passes on) must
never reach ``opus_decode``: libopus takes a zero length for a lost packet
and conceals it for the whole buffer, 120 ms of invented audio.

A packet that did not arrive is filled in by libopus itself, from what it
knows of the stream, only ever for the lost frame's own length
(``conceal``); the last one before a packet that did arrive is decoded from
that packet's in-band FEC, a low-rate copy of the previous frame which a
sender adds once the answer says ``useinbandfec=1`` (``recover``; libopus
conceals instead when the packet carries none).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fractions
import logging
import weakref
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import av
import numpy as np

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
RTP_TIME_BASE = fractions.Fraction(1, 48_000)  # Opus's RTP clock, whatever the decoding rate
MAX_PACKET_SAMPLES = 1920  # 120 ms at 16 kHz: Opus's longest packet
GRANULE_SAMPLES = 40  # 2.5 ms at 16 kHz: Opus's shortest frame, and the unit of the others
OPUS_OK = 0


class OpusDecodeError(ValueError):
    pass


@dataclass(frozen=True)
class DecodedAudio:
    """One packet's audio: int16 mono at ``sample_rate``, stamped with its
    RTP timestamp like aiortc's frames (``pts`` in ``time_base``)."""

    samples: np.ndarray
    pts: int
    sample_rate: int = SAMPLE_RATE
    time_base: fractions.Fraction = RTP_TIME_BASE


def _candidates() -> list[str]:
    bundled = Path(av.__file__).resolve().parent.parent / "av.libs"
    found = sorted(str(p) for p in bundled.glob("libopus*.so*"))
    if found:
        return found
    # find_library runs ldconfig (or a compiler): only when PyAV has none.
    system = ctypes.util.find_library("opus")
    return [system] if system else []


@cache
def _libopus() -> ctypes.CDLL | None:
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            lib.opus_decoder_create.restype = ctypes.c_void_p
            lib.opus_decoder_create.argtypes = [
                ctypes.c_int32,
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int),
            ]
            lib.opus_decode.restype = ctypes.c_int
            lib.opus_decode.argtypes = [
                ctypes.c_void_p,
                ctypes.c_char_p,
                ctypes.c_int32,
                ctypes.c_void_p,
                ctypes.c_int,
                ctypes.c_int,
            ]
            lib.opus_decoder_destroy.restype = None
            lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
            if hasattr(lib, "opus_packet_has_lbrr"):  # libopus 1.5 and later
                lib.opus_packet_has_lbrr.restype = ctypes.c_int
                lib.opus_packet_has_lbrr.argtypes = [ctypes.c_char_p, ctypes.c_int32]
        except (OSError, AttributeError):
            continue
        return lib
    log.info("no libopus to decode at 16 kHz: the caller's audio takes aiortc's decoder")
    return None


def available() -> bool:
    return _libopus() is not None


class WidebandOpusDecoder:
    """One caller's Opus stream (mono or stereo) into 16 kHz mono."""

    def __init__(self) -> None:
        lib = _libopus()
        if lib is None:
            raise OpusDecodeError("libopus is not available")
        error = ctypes.c_int()
        handle = lib.opus_decoder_create(SAMPLE_RATE, 1, ctypes.byref(error))
        if error.value != OPUS_OK or not handle:
            raise OpusDecodeError(f"opus_decoder_create failed ({error.value})")
        self._lib = lib
        self._handle = handle
        self._buffer = np.zeros(MAX_PACKET_SAMPLES, dtype=np.int16)
        # The native state goes with the object, however the call ends.
        self._release = weakref.finalize(self, lib.opus_decoder_destroy, handle)

    def decode(self, payload: bytes, timestamp: int) -> DecodedAudio:
        if not payload:
            raise OpusDecodeError("an empty payload is no Opus packet")
        return self._decode(payload, MAX_PACKET_SAMPLES, False, timestamp)

    def conceal(self, samples: int, timestamp: int) -> DecodedAudio:
        """``samples`` (16 kHz) of a lost frame, invented by libopus's PLC."""
        return self._decode(None, self._lost_length(samples), False, timestamp)

    def recover(self, payload: bytes, samples: int, timestamp: int) -> DecodedAudio:
        """The lost frame (``samples`` long) just before ``payload``, from
        the FEC data in it; libopus conceals it when there is none. The
        packet itself is still to be decoded afterwards."""
        if not payload:
            raise OpusDecodeError("an empty payload is no Opus packet")
        return self._decode(payload, self._lost_length(samples), True, timestamp)

    def has_fec(self, payload: bytes) -> bool | None:
        """Whether ``payload`` carries FEC for the frame before it (None:
        this libopus cannot tell)."""
        if not hasattr(self._lib, "opus_packet_has_lbrr") or not payload:
            return None
        found = self._lib.opus_packet_has_lbrr(payload, len(payload))
        return None if found < 0 else bool(found)

    @staticmethod
    def _lost_length(samples: int) -> int:
        # libopus fills exactly the length asked for: a wrong one is a hole
        # or invented audio in the caller's stream, so it is refused here.
        if not 0 < samples <= MAX_PACKET_SAMPLES or samples % GRANULE_SAMPLES:
            raise OpusDecodeError(f"no Opus frame is {samples} samples at 16 kHz")
        return samples

    def _decode(self, payload: bytes | None, limit: int, fec: bool, timestamp: int) -> DecodedAudio:
        if not self._release.alive:
            raise OpusDecodeError("the decoder is closed")
        size = len(payload) if payload else 0
        decoded = self._lib.opus_decode(
            self._handle, payload, size, self._buffer.ctypes.data, limit, int(fec)
        )
        if decoded < 0:
            raise OpusDecodeError(f"opus_decode failed ({decoded}) on a {size}-byte packet")
        return DecodedAudio(self._buffer[:decoded].copy(), timestamp)

    def close(self) -> None:
        self._release()
