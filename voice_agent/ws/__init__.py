"""A call over a WebSocket: OpenAI's Realtime WebSocket transport, the same
session and protocol as a WebRTC call (voice_agent/rtc/call_core.py)."""
