"""sinal: every activity of a commerce + WhatsApp CRM platform as one standardized event.

```python
import sinal
ledger = sinal.connect("sqlite:///sinal.db")
ledger.migrate()
result = ledger.emit_event(account_id=..., contact_id=..., metric_name=sinal.METRIC_ORDER_PAID,
                           source="shopify", source_id="1001", entity_type="order")
```
"""

from __future__ import annotations

import threading
from typing import Any

from sinal.aio import AsyncLedger
from sinal.catalog import *  # noqa: F403 - the seed's constants are part of the public API
from sinal.catalog import __all__ as _catalog_all
from sinal.errors import (
    AccountNotFound,
    ConfigurationError,
    ContactNotFound,
    ConversationClosed,
    DuplicateKey,
    FieldError,
    IdentityConflict,
    InvalidAccount,
    InvalidContact,
    InvalidEvent,
    InvalidIntegration,
    InvalidLink,
    InvalidQuery,
    RetryLater,
    SchemaOutOfDate,
    SchemaViolation,
    SecretUnreadable,
    SignatureMismatch,
    SinalError,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    UnstorableInput,
    UnstorableText,
    WebhookError,
)
from sinal.events import EmitEvent, EmitResult
from sinal.keyring import Keyring, parse_keyring
from sinal.ledger import Ledger, connect
from sinal.store.base import Account, Contact, EventQuery, Rejection, SummaryRow

__version__ = "0.1.0"

_default: Ledger | None = None
_default_lock = threading.Lock()


def default_ledger() -> Ledger:
    """The process-wide ledger on SINAL_DATABASE_URL (default sqlite:///sinal.db)."""
    global _default  # noqa: PLW0603 - one lazily built ledger per process, by design
    with _default_lock:
        if _default is None:
            from sinal.config import Settings

            settings = Settings.from_env()
            # as the CLI's commands open it: a path with no database, or one not migrated,
            # says to run `sinal migrate` (an empty sinal.db was made, and the first event
            # raised SchemaViolation: "no such table: rejections")
            ledger = connect(settings.database_url, wait=settings.database_wait,
                             create=False, keyring=settings.keyring())  # fmt: skip
            try:
                ledger.check_schema()
            except BaseException:
                ledger.close()
                raise
            _default = ledger
        return _default


def emit_event(**params: Any) -> EmitResult:
    """`Ledger.emit_event` on the default ledger (see `default_ledger`)."""
    return default_ledger().emit_event(**params)


def emit_many(events: list[EmitEvent]) -> list[EmitResult]:
    """`Ledger.emit_many` on the default ledger."""
    return default_ledger().emit_many(events)


__all__ = [  # noqa: PLE0604 - the catalog's names are re-exported whole
    *_catalog_all,
    "Account",
    "AccountNotFound",
    "AsyncLedger",
    "ConfigurationError",
    "Contact",
    "ContactNotFound",
    "ConversationClosed",
    "DuplicateKey",
    "EmitEvent",
    "EmitResult",
    "EventQuery",
    "FieldError",
    "IdentityConflict",
    "InvalidAccount",
    "InvalidContact",
    "InvalidEvent",
    "InvalidIntegration",
    "InvalidLink",
    "InvalidQuery",
    "Keyring",
    "Ledger",
    "Rejection",
    "RetryLater",
    "SchemaOutOfDate",
    "SchemaViolation",
    "SecretUnreadable",
    "SignatureMismatch",
    "SinalError",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "UnstorableInput",
    "UnstorableText",
    "SummaryRow",
    "WebhookError",
    "__version__",
    "connect",
    "default_ledger",
    "emit_event",
    "emit_many",
    "parse_keyring",
]
