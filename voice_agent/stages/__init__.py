"""Pipeline stages: turn detection, transcription, reply generation, speech.

Stages are plain asyncio code over backends. They know nothing of WebRTC,
HTTP or the event protocol.
"""
