"""Speech-to-text backends."""
