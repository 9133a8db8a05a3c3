"""WebRTC media: the paced outbound track, the inbound reader and the peer connection."""
