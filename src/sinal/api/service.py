"""What every request shares: the ledger, the group committer, the key cache, metrics."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from starlette.requests import Request

from sinal.api.errors import Forbidden, Unauthorized
from sinal.api.metrics import Metrics
from sinal.auth import Scope, hash_key
from sinal.config import Settings
from sinal.errors import StoreUnavailable
from sinal.group_commit import GroupCommitter
from sinal.ledger import Ledger
from sinal.store.base import ApiKey

P = ParamSpec("P")
T = TypeVar("T")
_MAX_CACHED_KEYS = 10_000

# Seconds /readyz and /metrics wait for the database. While it does not answer, the
# requests' calls each hold a thread for up to ~30 s (`sinal.store.libpq`), and a probe
# queued behind them would time out in the orchestrator or in Prometheus (10 s by
# default): the probe says "not ready" and the scrape keeps the service's own figures.
PROBE_TIMEOUT = 2.0
# Threads for the requests' blocking calls, at least (see `Service.__init__`).
MIN_CALL_THREADS = 32


class ProbeTimeout(StoreUnavailable):
    """The database did not answer a probe within `PROBE_TIMEOUT` seconds."""


@dataclass(slots=True)
class KeyCache:
    """API key lookups, remembered for `ttl` seconds (negative answers too).

    A revoked key keeps working for at most `ttl` seconds in each process; 0 disables
    the cache. Keys are cached by their hash, never by their text.
    """

    ttl: float
    entries: dict[str, tuple[float, ApiKey | None]] = field(default_factory=dict)

    def get(self, key_hash: str) -> tuple[bool, ApiKey | None]:
        """(found, key): found is False when the hash is not cached or has expired."""
        entry = self.entries.get(key_hash)
        if entry is None or entry[0] < time.monotonic():
            return False, None
        return True, entry[1]

    def put(self, key_hash: str, key: ApiKey | None) -> None:
        """Remember an answer."""
        if self.ttl <= 0:
            return
        if len(self.entries) >= _MAX_CACHED_KEYS:
            self.entries.clear()  # crude, but bounded; a flood of bad keys cannot grow it
        self.entries[key_hash] = (time.monotonic() + self.ttl, key)


class Service:
    """The app's shared state (on `app.state.service`)."""

    def __init__(self, settings: Settings, ledger: Ledger, metrics: Metrics) -> None:
        self.settings = settings
        self.ledger = ledger
        self.metrics = metrics
        self.keys = KeyCache(settings.auth_cache_ttl)
        self._probes = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sinal-probe")
        # The requests' blocking calls get threads of their own, more than the store has
        # connections: each call then waits for a connection, or a lock, at most the
        # database wait (503 after it). On asyncio's default executor, min(32, cpus + 4)
        # threads, six calls waiting on a lock held every other request queued behind them.
        connections = getattr(ledger.store, "max_connections", 0)
        self._calls = ThreadPoolExecutor(
            max_workers=max(MIN_CALL_THREADS, 2 * connections), thread_name_prefix="sinal-call"
        )
        self.committer = GroupCommitter(
            ledger,
            max_batch=settings.group_commit_max_batch,
            max_delay=settings.group_commit_max_delay,
        )

    def public_base_url(self, request: Request) -> str:
        """The base of the URLs this service hands out (short links, webhook URLs):
        SINAL_PUBLIC_URL when set (behind a proxy the request's host is an internal one),
        else the request's own base URL; never with a trailing slash."""
        return (self.settings.public_url or str(request.base_url)).rstrip("/")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run blocking ledger work in a worker thread: the event loop never waits on I/O."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._calls, call)

    async def probe(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` for a health probe or a scrape: on threads of its own, never queued
        behind the requests' calls, and for at most `PROBE_TIMEOUT` seconds, after which
        `ProbeTimeout` (`fn` finishes on its thread, unwaited for)."""
        call = functools.partial(fn, *args, **kwargs)
        future = asyncio.get_running_loop().run_in_executor(self._probes, call)
        try:
            return await asyncio.wait_for(future, PROBE_TIMEOUT)
        except TimeoutError:
            raise ProbeTimeout(f"the database did not answer within {PROBE_TIMEOUT:g} s") from None

    def close(self) -> None:
        """Let the probes' and calls' threads go (one still waiting on the database ends on
        its own)."""
        self._probes.shutdown(wait=False, cancel_futures=True)
        self._calls.shutdown(wait=False, cancel_futures=True)

    async def authorize(self, request: Request, scope: Scope | None) -> ApiKey:
        """The request's key, which must hold `scope` (None: any valid key)."""
        header = request.headers.get("authorization", "")
        kind, _, text = header.partition(" ")
        if kind.lower() != "bearer" or not text.strip():
            raise Unauthorized("send an API key: Authorization: Bearer <key>")
        text = text.strip()
        digest = hash_key(text)
        found, key = self.keys.get(digest)
        if not found:
            key = await self.run(self.ledger.authenticate, text)
            self.keys.put(digest, key)
        if key is None:
            raise Unauthorized("the API key is unknown or revoked")
        if scope is not None and scope not in key.scopes:
            raise Forbidden(
                f"this route needs an API key with the {scope!r} scope; this key has "
                f"{', '.join(key.scopes)}: make one with `sinal keys create --account "
                f"{key.account_id} --scopes {','.join([*key.scopes, scope])}`"
            )
        return key


def service(request: Request) -> Service:
    """The app's `Service`."""
    svc: Service = request.app.state.service
    return svc
