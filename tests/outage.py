"""`sinal serve` on PostgreSQL across a link cut for a while, or with PostgreSQL
stopped for a while: what its clients get.

    sudo .venv/bin/python -m tests.outage [--cut 90] [--clients 8]
    .venv/bin/python -m tests.outage --stop [--cut 90] [--clients 8]

Not a test (it takes two minutes): the figures README.md gives under "PostgreSQL across a
network". It makes a database, reaches it through `tests.contract.test_network.Partition`
(root and iproute2) or, with `--stop`, through `Outage` (a relay on loopback, stopped and
started again: connections closed, then refused), starts `sinal serve` on it with sinal's
defaults, and has `--clients` clients post events in a loop while the link is cut or the
server stopped for `--cut` seconds. It prints the answers by second, the slow ones, what
/readyz and /metrics answered meanwhile, and whether every event answered 201 was stored.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Protocol

import httpx
import psycopg

from tests.conftest import PG_URL
from tests.contract.test_network import Outage, Partition
from tests.helpers import sql
from tests.integration.test_serve import SINAL, cli, serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cut", type=float, default=90.0, help="seconds the link is cut")
    parser.add_argument("--clients", type=int, default=8, help="clients posting in a loop")
    parser.add_argument("--stop", action="store_true", help="stop the server, not the link")
    args = parser.parse_args()

    database = f"sinal_outage_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    url = PG_URL.rsplit("/", 1)[0] + "/" + database
    link: Link = _Stopped(url) if args.stop else Partition(url)
    env = {**os.environ, "SINAL_DATABASE_URL": link.url}
    try:
        run(link, env, args.cut, args.clients, url)
    finally:
        link.close()
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


class Link(Protocol):
    url: str

    def cut(self) -> None: ...
    def heal(self) -> None: ...
    def close(self) -> None: ...


class _Stopped(Outage):
    """`Outage` as a `Link`: cut is a stop, heal a start."""

    def cut(self) -> None:
        self.stop()

    def heal(self) -> None:
        self.start()

    def close(self) -> None:
        self.stop()


def run(link: Link, env: dict[str, str], cut: float, clients: int, url: str) -> None:
    subprocess.run([SINAL, "migrate"], env=env, check=True, capture_output=True)
    account = cli(env, "accounts", "create", "--name", "Loja")
    key = cli(env, "keys", "create", "--account", account["id"], "--scopes", "ingest")["key"]
    with tempfile.TemporaryDirectory() as cwd, serving(env, Path(cwd)) as base:
        answers = load(link, base, key, cut, clients)
    [(stored,)] = sql(url, "SELECT count(*) FROM events")
    created = answers[201]
    print(f"answers {dict(answers)}; events stored {stored}, answered 201 {created}")
    print("every event answered 201 is stored" if stored >= created else "LOST EVENTS")


def load(
    link: Link, base: str, key: str, cut: float, clients: int
) -> collections.Counter[int | str]:
    answers: collections.Counter[int | str] = collections.Counter()
    by_second: dict[int, collections.Counter[int | str]] = collections.defaultdict(
        collections.Counter
    )
    slow: list[tuple[float, float, int | str]] = []
    start = time.monotonic()
    stop = threading.Event()
    numbers = iter(range(10**9))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(timeout=300, headers={"Authorization": f"Bearer {key}"}) as http:
            while not stop.is_set():
                began = time.monotonic()
                number = str(next(numbers))
                event = {"metric": "Order Paid", "source": "shopify", "source_id": number,
                         "contact": {"phone": "+5511987654321"}}  # fmt: skip
                try:
                    answer: int | str = http.post(f"{base}/v1/events", json=event).status_code
                except httpx.HTTPError as exc:
                    answer = type(exc).__name__
                took = time.monotonic() - began
                with lock:
                    answers[answer] += 1
                    by_second[int(began - start)][answer] += 1
                    if took > 1:
                        slow.append((began - start, took, answer))
                time.sleep(0.05)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(5)
    link.cut()
    print(f"cut at {time.monotonic() - start:.1f} s", flush=True)
    time.sleep(min(20.0, cut / 2))
    for path in ("/readyz", "/metrics"):
        began = time.monotonic()
        response = httpx.get(f"{base}{path}", timeout=60)
        backlog = "with" if "sinal_outbox_rows" in response.text else "without"
        what = response.text[:90] if path == "/readyz" else f"{backlog} the backlog"
        print(f"{path} during the cut: {response.status_code} in "
              f"{time.monotonic() - began:.2f} s, {what}", flush=True)  # fmt: skip
    time.sleep(max(0.0, cut - min(20.0, cut / 2)))
    link.heal()
    print(f"healed at {time.monotonic() - start:.1f} s", flush=True)
    time.sleep(15)
    stop.set()
    for thread in threads:
        thread.join()

    for second in sorted(by_second):
        print(f"  started in second {second:3d}: {dict(by_second[second])}")
    print(f"requests over 1 s: {len(slow)}")
    for began, took, answer in sorted(slow):
        print(f"  started at {began:6.1f} s, answered {answer} after {took:5.1f} s")
    return answers


if __name__ == "__main__":
    main()
