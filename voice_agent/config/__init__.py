"""The service's settings (``Settings``, ``load_settings``) and the rule
for weak secrets; the fields themselves live in one module per section."""

from voice_agent.config.secrets import MIN_SECRET_CHARS, PLACEHOLDER_MARKS, weak_secret
from voice_agent.config.settings import Settings, load_settings, read_config_file

__all__ = [
    "MIN_SECRET_CHARS",
    "PLACEHOLDER_MARKS",
    "Settings",
    "load_settings",
    "read_config_file",
    "weak_secret",
]
