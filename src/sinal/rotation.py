"""Key rotation: every stored secret sealed again with the current key (`sinal secrets`).

`rotate_secrets` walks the integrations, then the automations (their webhook steps'
signing secrets), in (account, id) order, `BATCH` rows per short transaction, sealing
again each secret the current key did not seal (plaintext, or a previous key's). A batch
commits whole or not at all, so an interrupted rotation keeps what it did, and running
it again finishes the rest: values already sealed with the current key are read, not
written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast, get_args
from uuid import UUID

from sinal.errors import ConfigurationError, SecretUnreadable
from sinal.keyring import PLAINTEXT, SECRET_KEYS_VARIABLE
from sinal.ledger import Ledger
from sinal.store.automations import AutomationStore, SecretTable

BATCH = 100  # integrations per transaction: writers of those rows wait for one at most


@dataclass(frozen=True, slots=True)
class SecretStatus:
    """How the stored secrets are sealed: the current key's id (None: no key is set) and
    the count of secrets per key id, `PLAINTEXT` for those not sealed."""

    current: str | None
    counts: dict[str, int]

    @property
    def total(self) -> int:
        """Every stored secret."""
        return sum(self.counts.values())

    @property
    def stale(self) -> int:
        """The secrets `sinal secrets rotate` would seal again."""
        return sum(n for kid, n in self.counts.items() if kid != self.current)

    def as_dict(self) -> dict[str, object]:
        """As `sinal secrets status --json` prints it."""
        by_key = {kid: n for kid, n in sorted(self.counts.items()) if kid != PLAINTEXT}
        return {"current_key": self.current, "total": self.total, "by_key": by_key,
                "plaintext": self.counts.get(PLAINTEXT, 0), "to_rotate": self.stale}  # fmt: skip


def secret_status(ledger: Ledger) -> SecretStatus:
    """How the ledger's stored secrets are sealed."""
    store = cast(AutomationStore, ledger.store)
    keyring = store.keyring
    return SecretStatus(None if keyring is None else keyring.current_id, store.count_secrets())


def check_rotation(ledger: Ledger) -> SecretStatus:
    """What `rotate_secrets` would start from; `ConfigurationError` when no key is set, and
    `SecretUnreadable` naming a key that sealed stored secrets but is not in the ring
    (nothing can be rotated before it is given back, after the current key)."""
    store = cast(AutomationStore, ledger.store)
    keyring = store.keyring
    if keyring is None:
        raise ConfigurationError(
            f"{SECRET_KEYS_VARIABLE} is not set: give it the key to seal with "
            "(`sinal secrets new-key ID` makes one)"
        )
    status = SecretStatus(keyring.current_id, store.count_secrets())
    for kid, n in sorted(status.counts.items()):
        if kid != PLAINTEXT and kid not in keyring.ids:
            raise SecretUnreadable(
                kid, f"{n} stored secret(s) are sealed with key {kid!r}, which "
                f"{SECRET_KEYS_VARIABLE} does not hold (it holds {', '.join(keyring.ids)}): "
                "give it back, after the current key, to rotate them"
            )  # fmt: skip
    return status


def rotate_secrets(ledger: Ledger, progress: Callable[[int], None] | None = None) -> int:
    """Seal again with the current key every secret another key sealed or none did; the
    number sealed. `progress(secrets read so far)` after each batch. Refused as
    `check_rotation` says; `SecretUnreadable` (naming the key) for a secret its key does
    not open (altered, or copied from another row): the batches before it stay."""
    check_rotation(ledger)
    store = cast(AutomationStore, ledger.store)
    read = resealed = 0
    for table in get_args(SecretTable):
        after: tuple[UUID, UUID] | None = None
        while True:
            batch = store.reseal_secrets(table, after, BATCH)
            read, resealed = read + batch.scanned, resealed + batch.resealed
            if progress is not None:
                progress(read)
            if batch.last is None:
                break
            after = batch.last
    return resealed
