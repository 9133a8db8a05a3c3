"""What makes a key or a secret anyone's: too short, or a placeholder
copied from the examples. Start-up refuses such API keys and TURN secrets."""

from __future__ import annotations

# Secrets shorter than this, or holding an example's placeholder, are
# anyone's: start-up refuses them (API keys: server/auth.py).
MIN_SECRET_CHARS = 16
PLACEHOLDER_MARKS = ("replace-me", "replace_me", "changeme", "change-me", "sk-...", "example")


def weak_secret(secret: str) -> str | None:
    """Why a key or secret is anyone's (too short, an example's), if it is."""
    if len(secret) < MIN_SECRET_CHARS:
        return f"shorter than {MIN_SECRET_CHARS} characters"
    if any(mark in secret.lower() for mark in PLACEHOLDER_MARKS):
        return "a placeholder from the examples; generate one"
    return None
