"""Failpoints: named places where a test can make a process stop dead (for kill -9 tests).

Off unless SINAL_FAILPOINTS names them; then, at a named point, the process writes
`$SINAL_FAILPOINT_DIR/<name>` and sleeps until it is killed. Costs one set lookup otherwise.
"""

from __future__ import annotations

import os
import time
from functools import cache
from pathlib import Path


@cache
def _active() -> frozenset[str]:
    return frozenset(filter(None, os.environ.get("SINAL_FAILPOINTS", "").split(",")))


def failpoint(name: str) -> None:
    """Hang here forever if the failpoint `name` is active."""
    if name not in _active():
        return
    marker = Path(os.environ.get("SINAL_FAILPOINT_DIR", ".")) / name
    marker.write_text(str(os.getpid()))
    while True:  # pragma: no cover - the test kills us here
        time.sleep(3600)
