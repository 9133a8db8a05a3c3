"""Self-hosted real-time voice agent over WebRTC."""

__version__ = "0.1.0"
