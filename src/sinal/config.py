"""Settings, read from the environment (SINAL_*) only here, at the edges.

Each field's environment variable is `SINAL_` + its name in upper case; `describe()`
lists them (for `sinal serve --help` and the README).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from sinal.errors import ConfigurationError

DEFAULT_DATABASE_URL = "sqlite:///sinal.db"


def _setting(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything configurable, with its default."""

    database_url: str = _setting(
        DEFAULT_DATABASE_URL, "sqlite:///relative.db, sqlite:////absolute.db or postgresql://…"
    )
    host: str = _setting("127.0.0.1", "address `sinal serve` listens on")
    port: int = _setting(8000, "port `sinal serve` listens on")
    public_url: str = _setting(
        "",
        "public base URL (https://sin.al) of short links and webhook URLs; default: the request's",
    )
    workers: int = _setting(1, "server processes (`sinal serve`); each runs its own group commit")
    auth_cache_ttl: float = _setting(
        2.0, "seconds an API key lookup is cached per process (0: none); bounds revocation delay"
    )
    max_event_bytes: int = _setting(1_048_576, "largest body of POST /v1/events (413 above)")
    max_batch_bytes: int = _setting(5_000_000, "largest body of POST /v1/events/batch")
    group_commit_max_batch: int = _setting(500, "events per group-commit transaction, at most")
    group_commit_max_delay: float = _setting(
        0.002, "seconds a single event waits for others to share its transaction"
    )
    log_level: str = _setting("info", "uvicorn log level: critical, error, warning, info, debug")
    serve_worker: bool = _setting(
        True, "run an automation worker inside `sinal serve` (false: run `sinal worker` apart)"
    )
    worker_lease: float = _setting(
        300.0, "seconds a worker holds an execution without progress before another takes it"
    )
    worker_concurrency: int = _setting(
        32, "executions a worker runs at once (threads; their step records share commits)"
    )
    worker_poll_interval: float = _setting(
        1.0, "seconds between polls when no NOTIFY arrives (PostgreSQL) or always (SQLite)"
    )
    housekeeping_interval: float = _setting(
        20.0, "seconds between a worker's housekeeping passes (abandoned checkouts); 0: none"
    )
    max_attempts: int = _setting(8, "attempts of a failing execution before it is dead")
    retry_base: float = _setting(1.0, "seconds of the first retry's backoff (doubles, jittered)")
    http_timeout: float = _setting(30.0, "seconds a step waits for WhatsApp, AI or a webhook")
    allow_private_webhooks: bool = _setting(
        False, "let webhook steps call private and loopback addresses"
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from SINAL_* environment variables; `ConfigurationError` if malformed."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(env_name(f.name))
            if raw is not None:
                values[f.name] = _convert(f.name, f.type, raw)
        if "public_url" in values:
            values["public_url"] = _public_url(values["public_url"])
        return cls(**values)

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with the given (non-None) values replaced."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def env_name(name: str) -> str:
    """The environment variable of a setting."""
    return f"SINAL_{name.upper()}"


def describe() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) for every setting."""
    return [(env_name(f.name), str(f.default), f.metadata["doc"]) for f in fields(Settings)]


def _convert(name: str, kind: object, raw: str) -> Any:
    if kind in (bool, "bool"):
        if raw.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if raw.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigurationError(f"{env_name(name)}={raw!r} is not true or false")
    try:
        if kind in (int, "int"):
            value: Any = int(raw)
        elif kind in (float, "float"):
            value = float(raw)
        else:
            return raw
    except ValueError:
        raise ConfigurationError(f"{env_name(name)}={raw!r} is not a number") from None
    if not value >= 0:  # negative or NaN
        raise ConfigurationError(f"{env_name(name)}={raw!r} must be a non-negative number")
    return value


def _public_url(raw: str) -> str:
    """SINAL_PUBLIC_URL checked, without its trailing slash ("" stays unset). Short links
    and webhook URLs are built on it: a bare `sin.al` would make them relative."""
    url = raw.strip()
    if url and not _is_base_url(url):
        raise ConfigurationError(
            f"{env_name('public_url')}={raw!r} must be an absolute http:// or https:// URL "
            "with a host and no query or fragment, e.g. https://sin.al"
        )
    return url.rstrip("/")


def _is_base_url(url: str) -> bool:
    """An http(s) URL with a host and maybe a port and a path (a proxy's prefix)."""
    parts = urlsplit(url)
    try:
        _ = parts.port  # a malformed or out-of-range port raises
    except ValueError:
        return False
    return (
        parts.scheme.lower() in ("http", "https")
        and bool(parts.hostname)
        and "?" not in url
        and "#" not in url
        and url.isprintable()
        and not any(c.isspace() for c in url)
    )
