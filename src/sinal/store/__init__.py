"""Storage backends behind one interface (`sinal.store.base.Store`)."""

from __future__ import annotations

import re

from sinal.errors import ConfigurationError
from sinal.keyring import Keyring
from sinal.store.base import DEFAULT_WAIT, Store


def open_store(
    url: str, *, wait: float = DEFAULT_WAIT, create: bool = True, keyring: Keyring | None = None
) -> Store:
    """The store for a database URL: "sqlite:///relative.db", "sqlite:////abs.db" or
    "postgresql://user@host:port/db" (a SQLite URL takes no query string: sinal chooses how
    to open the file, and "?mode=ro" was read as part of its name). A call waits up to
    `wait` seconds for the database (a connection; SQLite's write lock), then fails with
    `StoreUnavailable`. A SQLite file that does not exist is created, or with
    `create=False` is `ConfigurationError`.
    `keyring` seals the secrets it writes (integrations', webhook steps') and opens those
    it reads (`sinal.keyring`); without one they are written as they are."""
    scheme = url.partition(":")[0].lower()  # not urlsplit: "postgresql://[x" raised ValueError
    if scheme == "sqlite":
        if url[7:9] != "//":  # "sqlite:x.db" made a file named "sqlite:x.db"
            raise ConfigurationError(
                f"malformed SQLite URL {url!r}: use sqlite:///relative.db or "
                "sqlite:////absolute.db (three slashes, then the path)"
            )
        if "?" in url:  # "sqlite:///shop.db?mode=ro" opened a file named "shop.db?mode=ro"
            raise ConfigurationError(
                f"SQLite URL {url!r} has a query string, which sinal does not take (it opens "
                "the file itself): use sqlite:///relative.db or sqlite:////absolute.db"
            )
        path = url[9:].removeprefix("/")  # sqlite:///rel.db: rel.db; sqlite:////abs.db: /abs.db
        from sinal.store.sqlite import SQLiteStore

        return SQLiteStore(path, busy_timeout=wait, create=create, keyring=keyring)
    if scheme in ("postgresql", "postgres"):
        from sinal.store.postgres import PostgresStore

        return PostgresStore(url, wait=wait, keyring=keyring)
    raise ConfigurationError(
        f"unsupported database URL {mask_password(url)!r}: use sqlite:///file.db or "
        "postgresql://..."
    )


def mask_password(text: str) -> str:
    """`text` with the password of every URL in it masked: an error message is shown and
    logged, and one quoting a mistyped URL ("postgress://app:secret@db/x") showed it."""
    return _PASSWORD.sub(r"\1***@", text)


_PASSWORD = re.compile(r"([a-zA-Z][\w+.-]*://[^/@:\s\"']*:)[^/@\s\"']*@")

__all__ = ["DEFAULT_WAIT", "Store", "mask_password", "open_store"]
