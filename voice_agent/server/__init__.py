"""HTTP signaling: the Realtime WebRTC endpoint, health checks and the web page."""
