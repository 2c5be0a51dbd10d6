"""Settings, read from the environment (SINAL_*) only here, at the edges.

Each field's environment variable is `SINAL_` + its name in upper case; `describe()`
lists them (for `sinal serve --help` and the README).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sinal.automations.backoff import DEFAULT_BASE, DEFAULT_CAP, DEFAULT_MAX_ATTEMPTS, RetryPolicy
from sinal.errors import ConfigurationError
from sinal.group_commit import MAX_DELAY
from sinal.keyring import Keyring, parse_keyring
from sinal.ledger import MAX_BATCH
from sinal.retention import MAX_DAYS, Retention
from sinal.store import DEFAULT_WAIT
from sinal.urls import base_url_problem

DEFAULT_DATABASE_URL = "sqlite:///sinal.db"


# uvicorn's log levels, quietest first.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _setting(
    default: Any,
    doc: str,
    *,
    within: tuple[float, float] | None = None,
    or_zero: bool = False,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A field: its default, what it means, and the values it takes (`within`: a closed
    numeric range, `or_zero`: and 0, which turns the thing off; `choices`: the strings, any
    case)."""
    metadata = {"doc": doc, "within": within, "or_zero": or_zero, "choices": choices}
    return field(default=default, metadata=metadata)


def _retention(what: str) -> Any:
    """A retention period (`sinal.retention`): whole days, 0 (the default) for ever."""
    return _setting(
        0,
        f"days {what} before a worker deletes it; 0: for ever",
        within=(1, MAX_DAYS),
        or_zero=True,
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything configurable, with its default."""

    database_url: str = _setting(
        DEFAULT_DATABASE_URL,
        "sqlite:///relative.db, sqlite:////absolute.db (no query string) or postgresql://…",
    )
    database_wait: float = _setting(
        DEFAULT_WAIT,
        "seconds a call waits for the database (a PostgreSQL connection, SQLite's write lock) "
        "before 503; once PostgreSQL has been unreachable that long, calls fail at once",
        within=(0.1, 3_600),
    )
    host: str = _setting(
        "127.0.0.1", "address `sinal serve` (and `sinal worker`'s metrics) listens on"
    )
    port: int = _setting(8000, "port `sinal serve` listens on", within=(1, 65_535))
    public_url: str = _setting(
        "",
        "public base URL (https://sin.al) of short links and webhook URLs; default: the request's",
    )
    workers: int = _setting(
        1, "server processes (`sinal serve`); each runs its own group commit", within=(1, 256)
    )
    auth_cache_ttl: float = _setting(
        2.0,
        "seconds an API key lookup is cached per process (0: none); bounds revocation delay",
        within=(0, 3_600),
    )
    max_event_bytes: int = _setting(
        1_048_576, "largest body of POST /v1/events (413 above)", within=(1_024, 67_108_864)
    )
    max_batch_bytes: int = _setting(
        5_000_000, "largest body of POST /v1/events/batch", within=(1_024, 268_435_456)
    )
    group_commit_max_batch: int = _setting(
        500, "events per group-commit transaction, at most", within=(1, MAX_BATCH)
    )
    group_commit_max_delay: float = _setting(
        0.002,
        "seconds a single event waits for others to share its transaction",
        within=(0, MAX_DELAY),
    )
    log_level: str = _setting(
        "info",
        "log level of `sinal serve` (uvicorn and sinal) and `sinal worker`: "
        + ", ".join(LOG_LEVELS),
        choices=LOG_LEVELS,
    )
    serve_worker: bool = _setting(
        True, "run an automation worker inside `sinal serve` (false: run `sinal worker` apart)"
    )
    worker_lease: float = _setting(
        60.0,
        "seconds a stopped worker's executions stay claimed before another takes them over "
        "(a running worker renews its claims every third of it)",
        within=(1, 86_400),
    )
    worker_concurrency: int = _setting(
        32,
        "executions a worker runs at once (threads; their step records share commits)",
        within=(1, 1_024),
    )
    worker_metrics_port: int = _setting(
        0,
        "port `sinal worker` serves Prometheus metrics on, at the address SINAL_HOST (0: none)",
        within=(0, 65_535),
    )
    worker_poll_interval: float = _setting(
        1.0,
        "seconds between polls when no NOTIFY arrives (PostgreSQL) or always (SQLite)",
        within=(0.01, 3_600),
    )
    worker_hold_interval: float = _setting(
        60.0,
        "seconds an execution of a paused automation waits before a worker looks at it again "
        "(setting the automation active moves its held executions up at once)",
        within=(1, 86_400),
    )
    housekeeping_interval: float = _setting(
        20.0,
        "seconds between a worker's housekeeping passes (abandoned checkouts, retention); 0: none",
        within=(1, 86_400),  # more often, every worker would query the database non-stop
        or_zero=True,
    )
    rejections_retention_days: int = _retention(
        "a kept rejection (an event refused for its contact, or an automation step's event "
        "the database refused), replayed or not, stays"
    )
    webhook_deliveries_retention_days: int = _retention(
        "a finished webhook delivery (processed, unmappable, failed: a raw body, personal "
        "data) stays after its receipt"
    )
    executions_retention_days: int = _retention(
        "a finished automation execution (completed, stopped, dead, unknown), with its "
        "steps, stays after its last change"
    )
    max_attempts: int = _setting(
        DEFAULT_MAX_ATTEMPTS,
        "attempts of a failing execution before it is dead (the defaults retry for 20.7 to "
        "41.4 hours)",
        within=(1, 100),
    )
    retry_base: float = _setting(
        DEFAULT_BASE,
        "seconds of the first retry's backoff ceiling; each later one doubles, up to "
        "SINAL_RETRY_CAP, and the wait is drawn from its upper half",
        within=(0.01, 3_600),
    )
    retry_cap: float = _setting(
        DEFAULT_CAP,
        "seconds two attempts of a failing execution are apart, at most (at least "
        "SINAL_RETRY_BASE)",
        within=(1, 604_800),
    )
    http_timeout: float = _setting(
        30.0, "seconds a step waits for WhatsApp, AI or a webhook", within=(0.1, 3_600)
    )
    allow_private_webhooks: bool = _setting(
        False,
        "let webhook steps, and the WhatsApp and AI connections steps send with, call private "
        "and loopback addresses",
    )
    # Never in a repr (a log line, a traceback's locals): it is the key to every secret.
    secret_keys: str = field(
        default="",
        repr=False,
        metadata={
            "doc": "keys sealing stored secrets (integrations', webhook steps'): ID:BASE64 "
            "(32 bytes), comma-separated, the first sealing, the others still opening "
            "(rotation); unset: plaintext",
            "within": None, "or_zero": False, "choices": None,
        },
    )  # fmt: skip

    def __post_init__(self) -> None:
        """`ConfigurationError` for the first value out of its field's range: refused when
        read, not when the server or a worker first uses it (a traceback at startup, or a
        silent surprise: a key cached for ever, a request waiting for company for hours)."""
        for f in fields(self):
            value = getattr(self, f.name)
            within, choices = f.metadata.get("within"), f.metadata.get("choices")
            off = f.metadata.get("or_zero") and value == 0
            if within is not None and not off and not within[0] <= value <= within[1]:  # NaN too
                raise ConfigurationError(
                    f"{env_name(f.name)}={_number(value)} must be {_takes(f.metadata)}"
                )
            if choices is not None and value.lower() not in choices:
                raise ConfigurationError(
                    f"{env_name(f.name)}={value!r} must be one of {', '.join(choices)}"
                )
        if not self.host.strip():
            raise ConfigurationError(f"{env_name('host')} must not be empty")
        if self.retry_cap < self.retry_base:
            raise ConfigurationError(
                f"{env_name('retry_cap')}={_number(self.retry_cap)} must be at least "
                f"{env_name('retry_base')}={_number(self.retry_base)}"
            )
        self.keyring()  # ConfigurationError naming SINAL_SECRET_KEYS, never quoting it

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

    def keyring(self) -> Keyring | None:
        """The keys of `secret_keys` (None when unset: secrets are stored as they are)."""
        return parse_keyring(self.secret_keys, env_name("secret_keys"))

    def retention(self) -> Retention:
        """The retention periods, as `sinal.retention` takes them."""
        return Retention(
            rejections=self.rejections_retention_days,
            webhook_deliveries=self.webhook_deliveries_retention_days,
            executions=self.executions_retention_days,
        )

    def retry(self) -> RetryPolicy:
        """How a worker retries a failing execution, as `sinal.automations.backoff` takes it."""
        return RetryPolicy(max_attempts=self.max_attempts, base=self.retry_base, cap=self.retry_cap)

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with the given (non-None) values replaced."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def env_name(name: str) -> str:
    """The environment variable of a setting."""
    return f"SINAL_{name.upper()}"


def describe() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) for every setting; the meaning ends with the range a
    number must be within."""
    described = []
    for f in fields(Settings):
        doc, within = f.metadata["doc"], f.metadata["within"]
        if within is not None:
            zero = "0 or " if f.metadata["or_zero"] else ""
            doc = f"{doc} [{zero}{_range(within)}]"
        described.append((env_name(f.name), str(f.default), doc))
    return described


def _takes(metadata: Mapping[str, Any]) -> str:
    """The numbers a field takes, as messages write them: "within 1..65535", or "0 or
    within 1..86400"."""
    within = f"within {_range(metadata['within'])}"
    return f"0 or {within}" if metadata["or_zero"] else within


def _range(within: tuple[float, float]) -> str:
    """A closed range as messages and `describe()` write it: 1..65535, 0.01..3600."""
    return f"{_number(within[0])}..{_number(within[1])}"


def _number(value: float) -> str:
    """`value` as written in a range: 1, 0.01, 65535."""
    return f"{value:g}" if isinstance(value, float) and not value.is_integer() else f"{value:.0f}"


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
        what = "a whole number" if kind in (int, "int") else "a number"
        raise ConfigurationError(f"{env_name(name)}={raw!r} is not {what}") from None
    return value  # its range is the field's, checked by Settings


def _public_url(raw: str) -> str:
    """SINAL_PUBLIC_URL checked, without its trailing slash ("" stays unset). Short links
    and webhook URLs are built on it: a bare `sin.al` would make them relative. It is a
    base URL as a connection's is (paths are appended to it), and printable too: an
    invisible character would be in every short link."""
    url = raw.strip()
    name = env_name("public_url")
    if url and (not url.isprintable() or base_url_problem(url, name) is not None):
        raise ConfigurationError(
            f"{name}={raw!r} must be an absolute http:// or https:// URL "
            "with a host and no query or fragment, e.g. https://sin.al"
        )
    return url.rstrip("/")
