"""Audio primitives shared by every layer: PCM conversion and streaming resampling."""
