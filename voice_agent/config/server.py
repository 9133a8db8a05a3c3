"""Settings of the signaling server and the calls it admits: address and
ports, limits, authentication, ICE and TURN.
One section of ``Settings`` (voice_agent/config/settings.py)."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from voice_agent.config.secrets import weak_secret


class ServerSettings(BaseModel):
    # --- signaling server -------------------------------------------------
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port to listen on (0 = any free).")
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="A second port, on --host, that serves only GET /metrics and needs no key "
        "(for a scraper inside the cluster; 0 = none: /metrics is on --port, behind the keys).",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Reverse proxies (addresses or networks, comma-separated) whose "
        "X-Forwarded-For names the client: per-address limits then count the client, not the "
        "proxy. From any other peer the header is ignored (anyone can send it).",
    )
    cors_origins: list[str] = Field(
        default_factory=lambda: ["*"],
        description="Origins allowed to call the API from a browser (comma-separated; * = any).",
    )
    max_calls: int | None = Field(
        None,
        ge=1,
        description="Capacity: concurrent calls before answering 503 with Retry-After "
        "(default: from the CPU one turn's work takes on this host, measured at the first "
        "start and cached; docs/deploying.md, sizing).",
    )
    workers: int | None = Field(
        None,
        ge=0,
        le=256,
        description="Media/session worker processes behind the one port (default: one for "
        "every 5 calls of the capacity, at most one a core; on one core none). The models "
        "(STT, TTS, the embedded LLM) stay in one shared process each; 0 runs everything "
        "in this process.",
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM: how long live calls may go on (no new ones are taken) "
        "before each is ended with the goodbye. SIGINT, or a second SIGTERM, stops at once.",
    )
    drain_goodbye: str = Field(
        "I'm sorry, I have to end our call now. Goodbye!",
        min_length=1,
        description="Spoken to each call still live when the drain time is up.",
    )
    offers_per_minute: int = Field(
        60,
        ge=0,
        description="New calls one client address may offer per minute (a token bucket; "
        "over it: 429 with Retry-After; 0 = no limit).",
    )
    auth: Literal["auto", "required", "off"] = Field(
        "auto",
        description="API keys for calls, client secrets and the LLM proxy: 'auto' requires them "
        "unless the server listens on loopback only.",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="Accepted API keys (comma-separated; prefer VOICE_AGENT_API_KEYS or "
        "--api-keys-file: flags show in ps).",
    )
    api_keys_file: str | None = Field(
        None, description="File of accepted API keys, one a line (# comments allowed)."
    )
    offers_per_minute_per_key: int = Field(
        0,
        ge=0,
        description="New calls one API key may offer per minute, its client secrets included "
        "(0 = no limit; over it: 429 with Retry-After).",
    )
    requests_per_minute_per_key: int = Field(
        600,
        ge=0,
        description="Client secrets, ICE credentials (GET /v1/ice-servers) and LLM proxy "
        "requests one API key (or, with auth off, one address) may ask for per minute, "
        "together (0 = no limit; over it: 429 with Retry-After).",
    )
    max_calls_per_key: int = Field(
        0,
        ge=0,
        description="Calls one API key may have at once, its client secrets included "
        "(0 = no limit; over it: 429).",
    )
    max_offer_bytes: int = Field(64 * 1024, ge=1024, description="Largest SDP offer accepted.")
    connect_timeout_s: float = Field(
        20.0, gt=0, description="Release a call whose peer never connects within this time."
    )
    disconnect_grace_s: float = Field(
        3.0,
        ge=0,
        description="Release a call this long after its peer's connection is lost (ICE "
        "disconnected, or no audio packet from it; at least 1 s for the latter).",
    )
    max_call_duration_s: float = Field(3600.0, gt=0, description="Hard limit on one call.")
    ws_heartbeat_s: float = Field(
        15.0,
        gt=0,
        description="WebSocket calls: ping a client silent this long; one that does not "
        "answer within half of it is gone (its call ends as peer_lost).",
    )
    ws_idle_timeout_s: float = Field(
        300.0,
        gt=0,
        description="WebSocket calls: end a call whose client sends no event for this long "
        "(a gateway appends audio all the time; a client that stops is holding a slot).",
    )
    ice_servers: list[str] = Field(
        default_factory=list,
        description="STUN/TURN URLs (comma-separated). Empty by default: no public server assumed.",
    )
    ice_host_addresses: list[str] = Field(
        default_factory=list,
        description="Only offer ICE host candidates on these local addresses (comma-separated; "
        "default: every interface). 127.0.0.1 allows same-machine calls over loopback.",
    )
    ice_username: str | None = Field(None, description="Username for the TURN servers.")
    ice_credential: str | None = Field(None, description="Credential for the TURN servers.")
    # Short-lived TURN credentials (coturn's use-auth-secret), voice_agent/rtc/turn.py.
    turn_secret: str | None = Field(
        None,
        description="The TURN server's shared secret (coturn static-auth-secret): each peer "
        "connection and each GET /v1/ice-servers gets credentials minted from it (prefer "
        "VOICE_AGENT_TURN_SECRET: flags show in ps).",
    )
    turn_urls: list[str] = Field(
        default_factory=list,
        validate_default=True,
        description="TURN URLs handed to clients with minted credentials by GET /v1/ice-servers "
        "(comma-separated, e.g. turn:turn.example.com:3478?transport=udp); the server's own "
        "peer connections use them too unless --server-turn-urls is set.",
    )
    server_turn_urls: list[str] = Field(
        default_factory=list,
        description="TURN URLs for the server's own peer connections, where it reaches the TURN "
        "server at another address than clients do (default: --turn-urls).",
    )
    turn_ttl_s: int = Field(
        7200,
        ge=60,
        validate_default=True,
        description="Lifetime of minted TURN credentials; at least --max-call-duration-s (the "
        "TURN server refuses to refresh a call's allocation once its credential expired).",
    )
    public_url: str | None = Field(
        None,
        description="Absolute URL clients reach this very process at (e.g. http://NODE_IP:8080, "
        "or https://voice.example/pod/voice-agent-0 through an ingress): a call's Location is "
        "built on it, so its DELETE reaches the process that owns the call, and DELETE is "
        "served under its path too.",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"--trusted-proxies: {entry!r} is not an address or network"
                ) from None
        return value

    @field_validator("public_url")
    @classmethod
    def _absolute_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")) or "?" in value or "#" in value:
            raise ValueError("must be an absolute http(s) URL without query or fragment")
        return value.rstrip("/")

    # Field validators, not a model validator: a refusal then echoes only
    # the field's own value, never the TURN secret.
    @field_validator("turn_urls", "server_turn_urls")
    @classmethod
    def _turn_urls_need_the_secret(cls, value: list[str], info: ValidationInfo) -> list[str]:
        secret = info.data.get("turn_secret")
        if value and secret is None:
            raise ValueError("--turn-urls needs --turn-secret (the TURN server's shared secret)")
        if info.field_name == "turn_urls" and secret is not None and not value:
            raise ValueError("--turn-secret needs --turn-urls (where clients reach TURN)")
        weakness = weak_secret(secret) if secret is not None else None
        if info.field_name == "turn_urls" and weakness is not None:
            raise ValueError(f"--turn-secret is {weakness}")
        return value

    @field_validator("turn_ttl_s")
    @classmethod
    def _turn_credentials_outlast_a_call(cls, value: int, info: ValidationInfo) -> int:
        longest = info.data.get("max_call_duration_s")
        if info.data.get("turn_secret") is not None and longest is not None and value < longest:
            raise ValueError(
                f"--turn-ttl-s ({value}) is shorter than --max-call-duration-s "
                f"({longest:g}): a call's TURN allocation would expire"
            )
        return value
