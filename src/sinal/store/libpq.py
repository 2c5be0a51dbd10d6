"""The libpq settings sinal gives its PostgreSQL connections unless the URL gives its own.

libpq's own defaults suit a server on the same host. Across a network, a server that
stops answering without closing the connection (a partition, a host lost, a failover
that moved the address) is found late or never: a connection attempt waits as long as
the kernel retries (about two minutes), a statement whose request is not acknowledged
waits for the kernel's retransmissions (about fifteen), and an idle connection, such as
a worker's LISTEN, waits forever. With these, each fails within about 30 s, as
`StoreUnavailable`, and the pool or the listener connects again once the server answers.

- `connect_timeout`: a connection attempt, TLS and authentication included, at most 10 s;
- `keepalives_*`: a connection that carried nothing for 15 s is probed every 5 s and
  dropped after 3 unanswered probes (30 s in all), whether it is idle in the pool,
  listening, or waiting for a statement's answer;
- `tcp_user_timeout`: data sent and not acknowledged for 30 s drops the connection.

Neither cuts a long statement short: the server's kernel answers the probes and
acknowledges the request while PostgreSQL works on it.

A parameter the URL names is left as it is (`?connect_timeout=3`), as is
`connect_timeout` when `PGCONNECT_TIMEOUT` is set. A URL naming a `service` gets none
of these: its service file is the user's configuration. libpq ignores the TCP settings
on a Unix socket.
"""

from __future__ import annotations

import os
import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from sinal.errors import ConfigurationError
from sinal.store import mask_password

NETWORK_DEFAULTS: dict[str, str] = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "15",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",  # milliseconds
}

# the libpq parameters an environment variable sets (libpq reads it when a URL has none)
_ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT"}

# the values libpq accepts for a parameter that takes one of a list (libpq 18; exact case)
_CHOICES: dict[str, tuple[str, ...]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any", "read-write", "read-only", "primary", "standby", "prefer-standby"
    ),
}  # fmt: skip

# a port as libpq reads it (strtol in base 10, blanks around), empty for the default
_PORT = re.compile(r"\s*([+-]?[0-9]+)?\s*", re.ASCII)


def network_defaults(url: str) -> dict[str, Any]:
    """The parameters of `NETWORK_DEFAULTS` that neither `url` nor the environment sets:
    keyword arguments for `psycopg.connect` (which override the URL's own; `Any`, as those of
    `psycopg.connect` are). `ConfigurationError` for a URL libpq cannot read (a query
    parameter it does not know, as `?schema=public`): no connection can ever be made with
    it, so the store refuses it when made, not each time it tries to connect (a worker
    tried for ever, as if the database were only away). So is a value libpq reads but
    refuses when connecting: a port outside 1..65535, an `sslmode` not among its own."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = mask_password(str(exc).strip().splitlines()[0])  # libpq may quote the URL
        raise ConfigurationError(f"malformed PostgreSQL URL: {reason}") from None
    refused = _refused_value(given)
    if refused is not None:
        raise ConfigurationError(f"malformed PostgreSQL URL: {refused}")
    if "service" in given or os.environ.get("PGSERVICE"):
        return {}
    return {
        name: value
        for name, value in NETWORK_DEFAULTS.items()
        if name not in given and not _from_environment(name)
    }


def _refused_value(given: dict[str, Any]) -> str | None:
    """libpq's own words for a value of `given` it refuses when connecting, or None."""
    for port in str(given.get("port", "")).split(","):  # one per host: `h1:5432,h2:5433`
        match = _PORT.fullmatch(port)
        if match is None or (match[1] is not None and not 1 <= int(match[1]) <= 65535):
            return f'invalid port number: "{port}"'
    for name, choices in _CHOICES.items():
        value = given.get(name)
        if value is not None and value not in choices:
            return f'invalid {name} value: "{value}"'
    return None


def _from_environment(name: str) -> bool:
    variable = _ENVIRONMENT.get(name)
    return variable is not None and bool(os.environ.get(variable))
