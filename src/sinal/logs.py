"""Log lines that recur: an outage met on every request or every poll is written at most
once every `interval` seconds, each line counting the ones left out since the last. And
access log lines without the secrets a query string can carry."""

from __future__ import annotations

import logging
import re
import threading
import time
from urllib.parse import unquote_plus


class ThrottledLog:
    """A line written at most once every `interval` seconds (the first at once); the
    next one written says how many were left out meanwhile. Threads may share one (a
    worker's step threads meeting one misconfigured database)."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.logger = logger
        self.interval = interval
        self.next_at = 0.0
        self.left_out = 0
        self._lock = threading.Lock()

    def warning(self, message: str, *args: object) -> None:
        """`logger.warning(message, *args)`, unless a line was written less than `interval`
        seconds ago."""
        self.write(logging.WARNING, message, *args)

    def write(self, level: int, message: str, *args: object) -> None:
        """`logger.log(level, message, *args)`, unless a line was written less than
        `interval` seconds ago."""
        with self._lock:
            now = time.monotonic()
            if now < self.next_at:
                self.left_out += 1
                return
            more = f" ({self.left_out} more since the last line)" if self.left_out else ""
            self.next_at, self.left_out = now + self.interval, 0
        self.logger.log(level, message + "%s", *args, more)


# Query parameters whose values are secrets: the WhatsApp handshake's token, and an API
# key sent where it does not belong (`?api_key=` is refused, but its request is logged).
_SECRET_PARAMETERS = frozenset({"hub.verify_token", "api_key"})
_PARAMETER = re.compile(r"([?&])([^=&#]*)=([^&#]*)")


class RedactedQuery(logging.Filter):
    """uvicorn's access log lines (`--access-log`) with the values of secret query
    parameters as "***", their names read as the app reads them (`hub%2Everify_token`
    is `hub.verify_token`): the request line is logged as sent, and a WhatsApp handshake
    carries the integration's verify token in its query string."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path = _PARAMETER.sub(_redacted, args[2])
            record.args = (*args[:2], path, *args[3:])
        return True


def _redacted(match: re.Match[str]) -> str:
    name = unquote_plus(match[2]).lower()
    return f"{match[1]}{match[2]}=***" if name in _SECRET_PARAMETERS else match[0]
