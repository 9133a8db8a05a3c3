"""Text-to-speech backends."""
