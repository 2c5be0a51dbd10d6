"""The exceptions sinal raises, under one root.

```
SinalError
├── InvalidEvent          # .errors: one FieldError per bad field
├── InvalidContact        # .errors: one FieldError per bad identity
├── InvalidAccount        # .errors: bad name or timezone
├── InvalidIntegration    # .errors: bad connection settings
├── InvalidQuery          # .errors: bad query parameters (aggregates, filters)
├── InvalidLink           # .errors: a tracked link's bad fields
├── ContactNotFound
├── AccountNotFound
├── IdentityConflict      # .field: the identity already names another contact
├── ConversationClosed    # a closed conversation cannot be assigned
├── ConfigurationError    # a malformed setting, or a database not in UTF8
├── SecretUnreadable      # .key_id: a stored secret no key of SINAL_SECRET_KEYS opens
├── StoreError            # the driver's error is __cause__
│   ├── DuplicateKey      # .constraint
│   ├── UnstorableInput   # data the database refused (a value, a text, a constraint)
│   │   └── UnstorableText  # a NUL character PostgreSQL refused: the input's fault
│   ├── SchemaViolation   # a row sinal itself wrote broke the schema: a bug, not the input
│   ├── SchemaOutOfDate   # migrations not applied
│   ├── StoreMisconfigured  # .code, .fix: a privilege, a grant, a file not writable
│   └── StoreUnavailable  # .code: the database cannot take it now; a retry may pass
├── WebhookError
│   ├── SignatureMismatch
│   ├── UnmappablePayload # sinal.integrations: .reason; the delivery is kept for replay
│   └── DeliveryDeferred  # sinal.integrations: .until; processed again then
└── RetryLater            # raised by an automation step; .delay in seconds
```
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem with one input field: where, a machine-readable code, a sentence."""

    field: str
    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        """The error as a plain dict (for JSON answers)."""
        return {"field": self.field, "code": self.code, "message": self.message}


class SinalError(Exception):
    """Root of every error sinal raises on purpose."""


class _FieldErrors(SinalError, ValueError):
    """Base of the errors that carry one entry per bad field."""

    def __init__(self, errors: tuple[FieldError, ...] | list[FieldError]) -> None:
        self.errors: tuple[FieldError, ...] = tuple(errors)
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in self.errors))

    def __reduce__(self) -> tuple[type[_FieldErrors], tuple[tuple[FieldError, ...]]]:
        # Rebuild from the errors, not the message, so the error crosses process boundaries.
        return (type(self), (self.errors,))

    @property
    def field(self) -> str:
        """The first bad field (convenient when there is only one)."""
        return self.errors[0].field

    @property
    def reason(self) -> str:
        """The first error's code."""
        return self.errors[0].code


class InvalidEvent(_FieldErrors):
    """An event's input is malformed; nothing was written."""


class InvalidContact(_FieldErrors):
    """A contact's identities are malformed; nothing was written."""


class InvalidIntegration(_FieldErrors):
    """A connection's settings are malformed; nothing was written."""


class InvalidAccount(_FieldErrors):
    """An account's settings are malformed; nothing was written."""


class InvalidQuery(_FieldErrors):
    """A query's parameters are malformed."""


class InvalidLink(_FieldErrors):
    """A tracked link's fields are malformed; nothing was written."""


class ContactNotFound(SinalError, LookupError):
    """No such contact in this account (another account's id looks exactly the same)."""


class AccountNotFound(SinalError, LookupError):
    """No such account."""


class IdentityConflict(SinalError):
    """A phone, email or external id given for a contact already names another contact."""

    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(f"this {field.replace('_', ' ')} already belongs to another contact")


class ConversationClosed(SinalError):
    """The conversation is closed: it cannot be assigned (a new message opens a new one)."""


class ConfigurationError(SinalError, ValueError):
    """A setting is malformed (e.g. an unsupported database URL), or the database it
    names cannot hold sinal's data (PostgreSQL not in UTF8)."""


class SecretUnreadable(SinalError):
    """A stored secret cannot be opened: the key that sealed it (`key_id`) is not in
    `SINAL_SECRET_KEYS`, or the sealed value was altered or copied from another row."""

    def __init__(self, key_id: str, message: str) -> None:
        self.key_id = key_id
        super().__init__(message)

    def __reduce__(self) -> tuple[type[SecretUnreadable], tuple[str, str]]:
        return (type(self), (self.key_id, str(self)))


class StoreError(SinalError):
    """The storage backend failed; the driver's exception is chained as __cause__."""

    # What failed, for a program to branch on (the API's 503 carries it as `code`).
    code: str = "database_error"


class DuplicateKey(StoreError):
    """A unique key was violated."""

    def __init__(self, constraint: str | None) -> None:
        self.constraint = constraint
        super().__init__(f"duplicate key ({constraint})")


class UnstorableInput(StoreError, ValueError):
    """The database refused the data of a statement: a value out of a column's range, a
    text or JSON it cannot hold, a constraint (PostgreSQL's SQLSTATE classes 22, 23 but
    for a unique key, 44, a view's WITH CHECK OPTION, 54, and P0, an error a trigger
    raises; SQLite's constraint and data errors and a trigger's RAISE; but for those of
    `SchemaViolation`, sinal's own faults). The input is at fault
    and trying again cannot help, unlike most `StoreError`s. Validation refuses every such
    input it knows of first; this is the net under a check that was missed. Its message is
    the first line of the database's, which may name tables and quote data: the API
    answers with its title instead."""

    def __init__(
        self, message: str = "the database refused the input's data; sending it again fails alike"
    ) -> None:
        super().__init__(message)


class UnstorableText(UnstorableInput):
    """A text sent to PostgreSQL holds a NUL character, which it can neither store nor
    compare: the input is at fault, and trying again cannot help (unlike most
    `StoreError`s). Inputs are checked for NULs before they get here; this is the net
    under a check that was missed."""

    def __init__(self) -> None:
        super().__init__("the input holds a NUL character (\\u0000), which the database refuses")


class SchemaViolation(StoreError):
    """The database refused a statement for what sinal itself wrote or asked, whatever the
    input: a NOT NULL column left empty, a reference to a row that is not there (sinal
    checks each one it takes from an input first), a value of a type its column does not
    take, a statement beyond the database's limits, a table, column or function that is
    not there, SQL the database cannot parse (PostgreSQL's
    SQLSTATEs 23502, 23503 but a contact's key, 23001, 22004, 22012, 54001, 54011, 54023,
    and classes 42 but for 42501 (`StoreMisconfigured`), 0A, 0B, 0Z, 20, 21, 24, 25 but
    for 25006, 25P03 and 25P04 (`StoreUnavailable`), 26, 27, 2D, 2F, 34, 38 (an exception
    escaped a routine in another language), 39, 3B and 3F; SQLite's NOT NULL, FOREIGN KEY
    and datatype constraints, and its generic SQLITE_ERROR; either driver's refusal before
    sending, as for parameters not matching the placeholders). Also PostgreSQL's class
    XX (internal error, data or index corrupted), the database's own fault, which a retry
    reads again. A bug in sinal, or a schema changed under it: the API
    answers 500 with an error id and logs the traceback, rather than tell the client to
    change an input that is fine (`UnstorableInput`) or to send it again, which fails
    alike (on a database whose migrations are not all applied: `SchemaOutOfDate`, 503,
    instead). Its message is the first line of the database's."""


class StoreUnavailable(StoreError):
    """The database cannot be reached, or cannot take this now (a lost connection, a
    server restarting, a lock not granted in time, a transaction to retry, a standby that
    takes no writes, a session ended for a timeout, a snapshot too old): trying again
    later may succeed, unlike a `StoreError` of a statement the database refused. `code`
    says which, where it is known ("snapshot_too_old")."""

    code = "database_unavailable"

    def __init__(self, message: str = "", code: str = "") -> None:
        super().__init__(message)
        self.code = code or type(self).code


class StoreMisconfigured(StoreError):
    """The database refuses sinal what only its operator can give, whatever the input and
    whatever sinal's SQL: a privilege its role lacks (PostgreSQL's 42501), a grant or a
    role that is not valid (classes 0L, 0P), objects someone added in the way of sinal's
    (2B), a trigger someone added failing on sinal's tables (09), a SQLite file or
    directory this process cannot write. No retry helps until the operator acts: `code`
    names the trouble for a program ("insufficient_privilege", "database_read_only"),
    `fix` what the operator does, in words that name no table, host or path (the API
    answers with it); the message is the database's first line and the fix."""

    def __init__(self, reason: str, code: str, fix: str) -> None:
        super().__init__(f"{reason}; {fix}")
        self.reason = reason
        self.code = code
        self.fix = fix

    def __reduce__(self) -> tuple[type[StoreMisconfigured], tuple[str, str, str]]:
        return (type(self), (self.reason, self.code, self.fix))


class SchemaOutOfDate(StoreError):
    """The database's schema is older than this code: run `sinal migrate`."""

    code = "schema_out_of_date"


class WebhookError(SinalError):
    """A webhook delivery could not be accepted."""


class SignatureMismatch(WebhookError):
    """A webhook's signature does not match its raw body."""


class RetryLater(SinalError):
    """Raised by an automation step that should be retried later: after `delay` seconds if
    given, honoured as a server's `Retry-After` is (no sooner than the retry policy's
    backoff, at most its cap: `sinal.automations.backoff.honour_retry_after`)."""

    def __init__(self, message: str, delay: float = 0.0) -> None:
        self.delay = delay
        super().__init__(message)
