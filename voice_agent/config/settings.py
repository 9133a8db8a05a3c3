"""One settings model, fed by (highest first) command-line flags, environment
variables (``VOICE_AGENT_*``), an optional TOML/JSON config file, and defaults.

Its fields are kept by section, one module each (server, listening, stt,
llm, tts, operations), in the order they are listed in ``--help``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from voice_agent.config.listening import ListeningSettings
from voice_agent.config.llm import LlmSettings
from voice_agent.config.operations import OperationsSettings
from voice_agent.config.server import ServerSettings
from voice_agent.config.stt import SttSettings
from voice_agent.config.tts import TtsSettings


# Sections last to first: pydantic collects the fields of the last base first.
class Settings(
    BaseSettings,
    OperationsSettings,
    TtsSettings,
    LlmSettings,
    SttSettings,
    ListeningSettings,
    ServerSettings,
):
    # Lists come from the environment as "a,b" or as JSON ("[\"a\"]"): the
    # validator below reads both, so pydantic-settings must not insist on JSON.
    # hide_input_in_errors: a refused value may be a key or a secret.
    model_config = SettingsConfigDict(
        env_prefix="VOICE_AGENT_", extra="forbid", enable_decoding=False, hide_input_in_errors=True
    )

    @field_validator(
        "cors_origins",
        "trusted_proxies",
        "ice_servers",
        "ice_host_addresses",
        "api_keys",
        "turn_urls",
        "server_turn_urls",
        "tts_remote_voices",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("a JSON list that does not parse") from None
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags arrive as init kwargs and win over the environment; the config
        # file is merged below the environment by ``load_settings``.
        return (init_settings, env_settings)


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a TOML or JSON config file into a flat dict of settings."""
    text = path.read_text(encoding="utf-8")
    data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table of settings at the top level")
    return {str(key).replace("-", "_"): value for key, value in data.items()}


def load_settings(flags: dict[str, Any], config_file: Path | None = None) -> Settings:
    """Merge defaults < config file < environment < flags."""
    file_values = read_config_file(config_file) if config_file else {}
    # Values the environment sets count as "set"; defaults do not.
    env_values = Settings().model_dump(exclude_unset=True)
    explicit_flags = {key: value for key, value in flags.items() if value is not None}
    return Settings(**{**file_values, **env_values, **explicit_flags})
