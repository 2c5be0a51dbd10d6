"""Storage backends behind one interface (`sinal.store.base.Store`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from sinal.errors import ConfigurationError
from sinal.keyring import Keyring
from sinal.store.base import DEFAULT_WAIT, Store


def open_store(
    url: str, *, wait: float = DEFAULT_WAIT, create: bool = True, keyring: Keyring | None = None
) -> Store:
    """The store for a database URL: "sqlite:///relative.db", "sqlite:////abs.db" or
    "postgresql://user@host:port/db". A call waits up to `wait` seconds for the database
    (a connection; SQLite's write lock), then fails with `StoreUnavailable`. A SQLite file
    that does not exist is created, or with `create=False` is `ConfigurationError`.
    `keyring` seals the secrets it writes (integrations', webhook steps') and opens those
    it reads (`sinal.keyring`); without one they are written as they are."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        path = url.removeprefix("sqlite://")
        path = path.removeprefix("/")  # sqlite:///rel.db -> rel.db; sqlite:////abs.db -> /abs.db
        from sinal.store.sqlite import SQLiteStore

        return SQLiteStore(path, busy_timeout=wait, create=create, keyring=keyring)
    if scheme in ("postgresql", "postgres"):
        from sinal.store.postgres import PostgresStore

        return PostgresStore(url, wait=wait, keyring=keyring)
    raise ConfigurationError(
        f"unsupported database URL {url!r}: use sqlite:///file.db or postgresql://..."
    )


__all__ = ["DEFAULT_WAIT", "Store", "open_store"]
