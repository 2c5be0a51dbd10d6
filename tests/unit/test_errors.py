"""sinal's errors as a program receives them, also from another process."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from sinal.errors import StoreError, StoreMisconfigured, StoreUnavailable


def _raise(error: StoreError) -> None:
    raise error


@pytest.mark.parametrize(
    "error",
    [
        StoreUnavailable("could not serialize access", "serialization_failure"),
        StoreUnavailable("connection lost"),
        StoreMisconfigured(
            "permission denied for table events",
            "insufficient_privilege",
            "grant the role sinal connects as INSERT",
        ),
    ],
    ids=["unavailable", "unavailable-default-code", "misconfigured"],
)
def test_a_store_error_pickled_keeps_its_code_and_message(error: StoreError) -> None:
    """A worker's error crossing a process boundary (multiprocessing, concurrent.futures)
    is pickled: it comes back with its code ("serialization_failure"), not the default
    one (Exception's pickling carries the instance's attributes; pinned here)."""
    copy = pickle.loads(pickle.dumps(error))

    assert (type(copy), copy.code, str(copy)) == (type(error), error.code, str(error))


def test_a_store_unavailable_raised_in_another_process_keeps_its_code() -> None:
    """Raised in a process pool's worker, as a multi-worker setup does."""
    error = StoreUnavailable("snapshot too old", "snapshot_too_old")
    with ProcessPoolExecutor(1) as pool:
        raised = pool.submit(_raise, error).exception(timeout=60)

    assert isinstance(raised, StoreUnavailable)
    assert (raised.code, str(raised)) == ("snapshot_too_old", "snapshot too old")
