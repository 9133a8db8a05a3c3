"""The sixteen telephone events of RFC 4733 (section 3.2), by event number.

Apart from ``rtc/dtmf.py`` so that signaling can check the keys a gateway
reports without loading the media stack (aiortc, PyAV): the front of media
workers never handles media.
"""

EVENTS = "0123456789*#ABCD"  # events 0-15
