"""HTTP ingest: the real server (`sinal serve`, uvicorn) driven over loopback.

Run from the project root:

    .venv/bin/python bench/http.py [--backend postgresql|sqlite|both] [--quick] [--json]
                                   [--workers N] [--clients N] [--concurrency N]

For each backend, on a fresh database, the script starts `sinal serve` on a free port and
measures, after a warm-up:

- single events: `--concurrency` (32) requests in flight at once, each POST /v1/events
  answered only after its event is committed (group commit shares the transactions);
- batches: POST /v1/events/batch with 500 events each, 4 in flight.

It prints events/s and p50/p99 request latency, checks that the database holds exactly
the events sent (exit status 1 otherwise), and stops the server. The load comes from
`--clients` processes (default 2) of httpx.AsyncClient, which share the concurrency: one
Python client process cannot produce the load on its own. Targets (PostgreSQL, 2 cores,
client on the same machine): >= 3,000 single events/s, >= 20,000 events/s through
batches, p99 of single events < 50 ms. See bench/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named http.py: drop its folder from sys.path, or `import http.client`
# (inside httpx) would find this file instead of the standard library's package.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

import httpx
import psycopg
from rich.console import Console
from rich.table import Table

from sinal.ledger import connect

Backend = Literal["postgresql", "sqlite"]
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
SINAL = str(Path(sys.executable).with_name("sinal"))
BATCH = 500
BATCH_CONCURRENCY = 4
CONTACTS = 200
TARGETS = {"single": 3_000.0, "batch": 20_000.0, "p99_ms": 50.0}
console = Console(stderr=True)


@dataclass(frozen=True, slots=True)
class Phase:
    """One measured phase."""

    name: str
    events: int
    requests: int
    seconds: float
    latencies: list[float]  # seconds, one per request

    @property
    def rate(self) -> float:
        """Events per second."""
        return self.events / self.seconds

    def percentile(self, p: float) -> float:
        """Request latency at percentile p, in milliseconds."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


# -- the workload -------------------------------------------------------------------------


def event(contacts: list[str], n: int, rng: random.Random) -> dict[str, Any]:
    """A realistic Shopify order or WhatsApp message event (~0.5 KB)."""
    contact = contacts[n % len(contacts)]
    if rng.random() < 0.4:
        total = f"{rng.randint(1990, 49990) / 100:.2f}"
        return {
            "metric": "Order Paid",
            "contact_id": contact,
            "source": "shopify",
            "source_id": f"ord-{n}",
            "entity_type": "order",
            "value": total,
            "currency": "BRL",
            "occurred_at": "2026-11-20T14:03:00-03:00",
            "properties": {
                "order_id": f"ord-{n}",
                "order_number": f"#{100000 + n}",
                "total": total,
                "payment_method": rng.choice(["pix", "credit_card", "boleto"]),
                "items": [
                    {
                        "sku": f"SKU-{rng.randrange(9999):04d}",
                        "name": "Camiseta Básica",
                        "quantity": rng.randint(1, 3),
                        "price": "59.90",
                    }
                ],
                "store": "loja-exemplo.myshopify.com",
            },
        }
    return {
        "metric": "Message Sent",
        "contact_id": contact,
        "source": "whatsapp",
        "source_id": f"wamid.{n:012d}",
        "entity_type": "message",
        "properties": {
            "wa_message_id": f"wamid.HBgN{n:012d}",
            "message_type": "template",
            "template_name": "pedido_confirmado",
            "language": "pt_BR",
            "text": "Olá! Seu pedido foi confirmado e já está em separação.",
        },
    }


# -- the load, from several client processes ----------------------------------------------


async def _drive(
    base: str, key: str, bodies: list[dict[str, Any]], path: str, concurrency: int
) -> tuple[float, list[float], list[str]]:
    """POST every body with `concurrency` requests in flight; (seconds, latencies, errors)."""
    latencies: list[float] = []
    errors: list[str] = []
    queue = iter(bodies)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=60
    ) as client:

        async def worker() -> None:
            for body in queue:
                start = time.perf_counter()
                response = await client.post(path, json=body)
                latencies.append(time.perf_counter() - start)
                if response.status_code not in (200, 201):
                    errors.append(f"{response.status_code} {response.text[:200]}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, latencies, errors


def _client(args: tuple[str, str, list[dict[str, Any]], str, int, Any, Any]) -> None:
    base, key, bodies, path, concurrency, ready, out = args
    ready.wait()  # every client starts at once
    out.put(asyncio.run(_drive(base, key, bodies, path, concurrency)))


def load(
    base: str,
    key: str,
    bodies: list[dict[str, Any]],
    path: str,
    *,
    concurrency: int,
    clients: int,
) -> tuple[float, list[float], list[str]]:
    """Split the bodies and the concurrency over `clients` processes; wall time overall."""
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    shares = [bodies[i::clients] for i in range(clients)]
    per = [concurrency // clients + (1 if i < concurrency % clients else 0) for i in range(clients)]
    procs = [
        ctx.Process(target=_client, args=((base, key, share, path, c, ready, out),))
        for share, c in zip(shares, per, strict=True)
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.0)  # let the interpreters start
    start = time.perf_counter()
    ready.set()
    results = [out.get() for _ in procs]
    wall = time.perf_counter() - start
    for proc in procs:
        proc.join()
    return wall, [x for r in results for x in r[1]], [x for r in results for x in r[2]]


# -- the server ---------------------------------------------------------------------------


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def database(backend: Backend) -> Iterator[str]:
    """A fresh database's URL, dropped afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="sinal_http_") as tmp:
            yield f"sqlite:///{tmp}/bench.db"
        return
    admin = os.environ.get("SINAL_BENCH_PG", DEFAULT_PG)
    name = f"sinal_bench_http_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(admin)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def server(url: str, workers: int) -> Iterator[str]:
    """`sinal serve` on a free port; its base URL."""
    port = free_port()
    env = {**os.environ, "SINAL_DATABASE_URL": url, "SINAL_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [SINAL, "serve", "--port", str(port), "--workers", str(workers)], env=env
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("sinal serve did not start")
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def setup(url: str) -> tuple[str, list[str], UUID]:
    """An account, its contacts and an ingest key."""
    with connect(url) as ledger:
        ledger.migrate()
        account = ledger.create_account("Bench")
        contacts = [
            str(ledger.create_contact(account.id, external_id=f"c{i}").id) for i in range(CONTACTS)
        ]
        key, _ = ledger.create_api_key(account.id, ["ingest", "read"])
    return key, contacts, account.id


def stored(url: str, account: UUID) -> int:
    """Events the account has (Contact Created events excluded)."""
    with connect(url) as ledger:
        return sum(m.event_count for m in ledger.list_metrics(account))


def run_backend(backend: Backend, args: argparse.Namespace) -> list[Phase]:
    """Both phases on one backend."""
    rng = random.Random(20261129)
    with database(backend) as url:
        key, contacts, account = setup(url)
        bodies = [event(contacts, n, rng) for n in range(args.single + args.batches * BATCH)]
        warm, single = bodies[:500], bodies[500 : args.single]
        batch_bodies = bodies[args.single :]
        batches = [
            {"events": batch_bodies[i : i + BATCH]} for i in range(0, len(batch_bodies), BATCH)
        ]
        with server(url, args.workers) as base:
            load(base, key, warm, "/v1/events", concurrency=args.concurrency, clients=args.clients)
            console.log(f"{backend}: {len(single):,} single events, {args.concurrency} in flight")
            wall, lat, errors = load(
                base, key, single, "/v1/events", concurrency=args.concurrency, clients=args.clients
            )
            check(errors)
            phases = [Phase("single", len(single), len(single), wall, lat)]
            console.log(
                f"{backend}: {len(batches)} batches of {BATCH}, {BATCH_CONCURRENCY} in flight"
            )
            wall, lat, errors = load(
                base,
                key,
                batches,
                "/v1/events/batch",
                concurrency=BATCH_CONCURRENCY,
                clients=min(args.clients, BATCH_CONCURRENCY),
            )
            check(errors)
            phases.append(Phase("batch", len(batch_bodies), len(batches), wall, lat))
        expected = len(bodies)
        found = stored(url, account)
        if found != expected:
            raise SystemExit(f"MISMATCH on {backend}: sent {expected} events, stored {found}")
        console.log(f"{backend}: the database holds all {found:,} events")
        return phases


def check(errors: list[str]) -> None:
    """Stop on any request that was not answered 200/201."""
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")


def report(results: dict[str, list[Phase]], args: argparse.Namespace) -> None:
    """A table per backend and the targets."""
    out = Console()
    table = Table(
        title=f"HTTP ingest ({args.workers} server worker(s), {args.clients} client "
        f"processes, loopback)",
        title_justify="left",
    )
    for header in (
        "backend",
        "route",
        "events",
        "requests",
        "seconds",
        "events/s",
        "p50 ms",
        "p99 ms",
    ):
        table.add_column(header, justify="left" if header in ("backend", "route") else "right")
    for backend, phases in results.items():
        for p in phases:
            route = "POST /v1/events" if p.name == "single" else f"POST /v1/events/batch ×{BATCH}"
            table.add_row(
                backend,
                route,
                f"{p.events:,}",
                f"{p.requests:,}",
                f"{p.seconds:.2f}",
                f"{p.rate:,.0f}",
                f"{p.percentile(50):.1f}",
                f"{p.percentile(99):.1f}",
            )
    out.print(table)
    if "postgresql" in results:
        single, batch = results["postgresql"]
        for what, value, target, ok in (
            ("single events/s ≥ 3,000", single.rate, TARGETS["single"], single.rate >= 3000),
            ("batch events/s ≥ 20,000", batch.rate, TARGETS["batch"], batch.rate >= 20000),
            (
                "single p99 < 50 ms",
                single.percentile(99),
                TARGETS["p99_ms"],
                single.percentile(99) < 50,
            ),
        ):
            verdict = "[green]holds[/green]" if ok else "[red]MISSED[/red]"
            out.print(f"postgresql: {what}: {value:,.1f} (target {target:,.0f}) → {verdict}")


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="3,000 single events, 20 batches")
    parser.add_argument("--single", type=int, help="single events (default 20,000)")
    parser.add_argument("--batches", type=int, help="batches of 500 (default 100)")
    parser.add_argument("--workers", type=int, default=2, help="server processes (default 2)")
    parser.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=32, help="single requests in flight")
    parser.add_argument("--json", action="store_true", help="print only the figures as JSON")
    args = parser.parse_args()
    args.single = (args.single or (3_000 if args.quick else 20_000)) + 500  # + warm-up
    args.batches = args.batches or (20 if args.quick else 100)
    return args


def main() -> int:
    """Run the benchmark."""
    args = parse_args()
    backends: list[Backend] = ["postgresql", "sqlite"] if args.backend == "both" else [args.backend]
    results = {b: run_backend(b, args) for b in backends}
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    b: {
                        p.name: {
                            "events_per_s": round(p.rate, 1),
                            "p50_ms": round(p.percentile(50), 2),
                            "p99_ms": round(p.percentile(99), 2),
                        }
                        for p in phases
                    }
                    for b, phases in results.items()
                }
            )
            + "\n"
        )
    else:
        report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
