"""Who may call through the gateway, and how much: its trunks.

A trunk is a party the operator lets in, known either by the addresses its
requests come from (``SIP_ALLOWED_SOURCES``) or by a digest username and
password it answers a challenge with (``SIP_AUTH_FILE``). A name given to
both is one trunk. Each trunk has its own limits on concurrent calls
(``SIP_MAX_CALLS_PER_TRUNK``) and on new calls a minute
(``SIP_CALLS_PER_MINUTE_PER_TRUNK``), so that one trunk (a flood, a looping
PBX, a leaked password) cannot take the call slots, or the service's budget
of new calls from the gateway, that the others need.

With neither sources nor users configured the gateway is open: anyone who
can reach the SIP port may call, each source address then being a trunk of
its own. ``run-gateway`` runs this file first: it checks the settings (a bad
one stops the start, with the reason) and warns loudly when open.

Plain Python, no Kamailio: gateway.py imports it inside Kamailio.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Trunk names and usernames end up in htable keys, log lines and headers:
# a conservative alphabet keeps them one safe token each.
NAME = re.compile(r"[A-Za-z0-9._@+:/-]{1,64}")
DEFAULT_MAX_CALLS = 10
# Half the service's default budget of new calls a minute from one client
# address (--offers-per-minute 60), which all of the gateway's calls share.
DEFAULT_CALLS_PER_MINUTE = 30


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Access:
    sources: tuple[tuple[Network, str], ...] = ()  # most specific network first
    users: Mapping[str, str] = field(default_factory=dict)  # username -> password
    realm: str = "voice-agent"
    default_max_calls: int = DEFAULT_MAX_CALLS  # 0: no limit
    max_calls: Mapping[str, int] = field(default_factory=dict)  # per trunk name
    default_calls_per_minute: int = DEFAULT_CALLS_PER_MINUTE  # 0: no limit
    calls_per_minute: Mapping[str, int] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        """No trunk configured: every source may call (each is its own trunk)."""
        return not self.sources and not self.users

    def trunk_of_source(self, address: str) -> str | None:
        """The trunk whose networks hold this address, or None."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        for network, name in self.sources:
            if ip.version == network.version and ip in network:
                return name
        return None

    def limit_of(self, trunk: str) -> int:
        return self.max_calls.get(trunk, self.default_max_calls)

    def rate_of(self, trunk: str) -> int:
        return self.calls_per_minute.get(trunk, self.default_calls_per_minute)


def parse_sources(text: str) -> tuple[tuple[Network, str], ...]:
    """``[name=]address[/prefix],...``: an entry without a name is its own trunk."""
    sources: list[tuple[Network, str]] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, _, spec = entry.rpartition("=")
        try:
            network = ipaddress.ip_network(spec.strip(), strict=False)
        except ValueError:
            raise SettingsError(f"SIP_ALLOWED_SOURCES: {spec!r} is no address or network") from None
        name = name.strip() or str(network)
        if not NAME.fullmatch(name):
            raise SettingsError(f"SIP_ALLOWED_SOURCES: {name!r} is no valid trunk name")
        sources.append((network, name))
    # Longest prefix first: a host listed inside a listed network is its own trunk.
    return tuple(sorted(sources, key=lambda item: -item[0].prefixlen))


def parse_users(text: str, origin: str) -> dict[str, str]:
    """Lines ``username:password`` (``#`` comments): each username is a trunk."""
    users: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, colon, password = line.partition(":")
        if not colon or not NAME.fullmatch(user) or not password:
            raise SettingsError(f"{origin}:{number}: expected username:password")
        if user in users:
            raise SettingsError(f"{origin}:{number}: {user!r} is listed twice")
        users[user] = password
    return users


def parse_per_trunk(text: str, setting: str, default: int) -> tuple[int, dict[str, int]]:
    """``N`` (every trunk) and/or ``name=N`` (that trunk), comma-separated; 0 = no limit."""
    per_trunk: dict[str, int] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, _, count = entry.rpartition("=")
        try:
            value = int(count)
        except ValueError:
            value = -1
        if value < 0:
            raise SettingsError(f"{setting}: {entry!r} is no count")
        if name:
            per_trunk[name.strip()] = value
        else:
            default = value
    return default, per_trunk


def from_environment(env: Mapping[str, str]) -> Access:
    users: dict[str, str] = {}
    if path := env.get("SIP_AUTH_FILE", ""):
        try:
            with open(path, encoding="utf-8") as handle:
                users = parse_users(handle.read(), path)
        except OSError as exc:
            raise SettingsError(f"SIP_AUTH_FILE: {exc}") from None
        if not users:
            # An empty file would silently mean "open": refuse it instead.
            raise SettingsError(f"SIP_AUTH_FILE: {path} lists no username:password")
    default_calls, max_calls = parse_per_trunk(
        env.get("SIP_MAX_CALLS_PER_TRUNK", ""), "SIP_MAX_CALLS_PER_TRUNK", DEFAULT_MAX_CALLS
    )
    default_rate, rates = parse_per_trunk(
        env.get("SIP_CALLS_PER_MINUTE_PER_TRUNK", ""),
        "SIP_CALLS_PER_MINUTE_PER_TRUNK",
        DEFAULT_CALLS_PER_MINUTE,
    )
    return Access(
        sources=parse_sources(env.get("SIP_ALLOWED_SOURCES", "")),
        users=users,
        realm=env.get("SIP_AUTH_REALM", "") or env.get("SIP_ADDRESS", "") or "voice-agent",
        default_max_calls=default_calls,
        max_calls=max_calls,
        default_calls_per_minute=default_rate,
        calls_per_minute=rates,
    )


def check_flood_settings(env: Mapping[str, str]) -> None:
    for name in ("SIP_FLOOD_REQUESTS", "SIP_FLOOD_INTERVAL_S", "SIP_FLOOD_BLOCK_S"):
        value = env.get(name, "")
        if value and not value.isdigit():
            raise SettingsError(f"{name}: {value!r} is no whole number")
    for name in ("SIP_FLOOD_INTERVAL_S", "SIP_FLOOD_BLOCK_S"):
        if env.get(name, "1") == "0":
            raise SettingsError(f"{name} must be at least 1")


def say(line: str) -> None:
    sys.stderr.write(line + "\n")


def main() -> int:
    """run-gateway's check before it starts anything: the settings, and a summary."""
    try:
        access = from_environment(os.environ)
        check_flood_settings(os.environ)
    except SettingsError as exc:
        say(f"run-gateway: {exc}")
        return 2
    if access.open:
        say(
            "run-gateway: WARNING: SIP is OPEN TO ANYONE who can reach the port: neither "
            "SIP_ALLOWED_SOURCES nor SIP_AUTH_FILE is set, so any caller on the internet can "
            "place calls on the service's API key. Set one of them (docs/sip.md)."
        )
    if os.environ.get("SIP_FLOOD_REQUESTS", "") == "0":
        say("run-gateway: WARNING: flood limits are off (SIP_FLOOD_REQUESTS=0)")
    trunks = sorted({name for _, name in access.sources} | set(access.users))
    for trunk in trunks:
        limit = access.limit_of(trunk)
        by = [str(network) for network, name in access.sources if name == trunk]
        if trunk in access.users:
            by.append(f"digest user (realm {access.realm})")
        rate = access.rate_of(trunk)
        say(
            f"run-gateway: trunk {trunk}: {', '.join(by)}; "
            f"{limit or 'unlimited'} concurrent calls, {rate or 'unlimited'} new a minute"
        )
    for setting, named in (
        ("SIP_MAX_CALLS_PER_TRUNK", access.max_calls),
        ("SIP_CALLS_PER_MINUTE_PER_TRUNK", access.calls_per_minute),
    ):
        # A misspelt trunk name would silently leave that trunk on the default.
        if (unknown := sorted(set(named) - set(trunks))) and not access.open:
            say(f"run-gateway: {setting} names no configured trunk: {', '.join(unknown)}")
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
