"""HTTP ingest: the real server (`sinal serve`, uvicorn) driven over loopback.

Run from the project root:

    .venv/bin/python bench/http.py [--backend postgresql|sqlite|both] [--quick] [--json]
                                   [--workers N] [--clients N] [--concurrency N]
                                   [--client raw|httpx]

For each backend, on a fresh database, the script starts `sinal serve` on a free port and
measures, after a warm-up:

- single events: `--concurrency` (32) requests in flight at once, each POST /v1/events
  answered only after its event is committed (group commit shares the transactions);
- batches: POST /v1/events/batch with 500 events each, 4 in flight.

It prints events/s and p50/p99 request latency, checks that the database holds exactly
the events sent (exit status 1 otherwise), and stops the server. The load comes from
`--clients` processes (default 2), which share the concurrency: one Python client
process cannot produce the load on its own. Each runs a minimal asyncio HTTP/1.1
keep-alive client (`--client raw`), since client and server share the two cores; `--client
httpx` uses httpx.AsyncClient, which costs the load generator several times the CPU.
Targets (PostgreSQL, 2 cores, client on the same machine): >= 3,000 single events/s,
>= 20,000 events/s through batches, p99 of single events < 50 ms. See bench/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named http.py: drop its folder from sys.path, or `import http.client`
# (inside httpx) would find this file instead of the standard library's package.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

try:
    import sniffio  # noqa: F401
except ImportError:
    # httpcore imports sniffio on every request; when it is not installed each failed
    # import searches sys.path again (~1 ms of CPU per request here). Mark it absent once.
    sys.modules["sniffio"] = None  # type: ignore[assignment]

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
import orjson
import psycopg
from rich.console import Console

from sinal.ledger import connect

Backend = Literal["postgresql", "sqlite"]
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
SINAL = str(Path(sys.executable).with_name("sinal"))
BATCH = 500
BATCH_CONCURRENCY = 4
WARMUP = 500
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
    server_cpu: float = 0.0  # CPU seconds of `sinal serve` and its workers
    database_cpu: float = 0.0  # CPU seconds of the PostgreSQL backends of the bench database

    @property
    def rate(self) -> float:
        """Events per second."""
        return self.events / self.seconds

    def cpu_per_event(self, seconds: float) -> float:
        """Microseconds of CPU per event."""
        return seconds / self.events * 1e6

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


@dataclass(frozen=True, slots=True)
class Target:
    """Where the load goes."""

    base: str
    key: str
    path: str


@dataclass(slots=True)
class Tally:
    """What one client process saw."""

    latencies: list[float]
    errors: list[str]


async def _drive(
    target: Target, bodies: list[bytes], concurrency: int, kind: str
) -> tuple[float, list[float], list[str]]:
    """POST every body from `concurrency` clients, each one request at a time on its own
    keep-alive connection; (seconds, latencies, errors)."""
    tally = Tally([], [])
    queue = iter(bodies)
    send = _raw_client if kind == "raw" else _httpx_client
    start = time.perf_counter()
    await asyncio.gather(*(send(target, queue, tally) for _ in range(concurrency)))
    return time.perf_counter() - start, tally.latencies, tally.errors


async def _httpx_client(target: Target, queue: Iterator[bytes], tally: Tally) -> None:
    """httpx.AsyncClient, one per simulated client: its shared pool costs more CPU per
    request as connections are added, and the load generator shares the 2 cores."""
    headers = {"Authorization": f"Bearer {target.key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=target.base, headers=headers, timeout=60) as http:
        for body in queue:
            start = time.perf_counter()
            response = await http.post(target.path, content=body)
            tally.latencies.append(time.perf_counter() - start)
            if response.status_code not in (200, 201):
                tally.errors.append(f"{response.status_code} {response.text[:200]}")


async def _raw_client(target: Target, queue: Iterator[bytes], tally: Tally) -> None:
    """A minimal HTTP/1.1 keep-alive client (asyncio streams): it costs the load generator
    a fraction of httpx's CPU, so the server, not the client, is what gets measured."""
    url = urlsplit(target.base)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST {target.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {target.key}\r\n"
        "Content-Type: application/json\r\nContent-Length: "
    ).encode()
    try:
        for body in queue:
            start = time.perf_counter()
            writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
            status, payload = await _read_response(reader)
            tally.latencies.append(time.perf_counter() - start)
            if status not in (200, 201):
                tally.errors.append(f"{status} {payload[:200]!r}")
    finally:
        writer.close()
        await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = await reader.readuntil(b"\r\n\r\n")
    lines = header.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def _client(args: tuple[Target, list[bytes], int, str, Any, Any]) -> None:
    target, bodies, concurrency, kind, ready, out = args
    ready.wait()  # every client starts at once
    out.put(asyncio.run(_drive(target, bodies, concurrency, kind)))


def load(
    base: str,
    key: str,
    bodies: list[bytes],
    path: str,
    *,
    concurrency: int,
    clients: int,
    kind: str,
) -> tuple[float, list[float], list[str]]:
    """Split the bodies and the concurrency over `clients` processes; wall time overall."""
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    shares = [bodies[i::clients] for i in range(clients)]
    per = [concurrency // clients + (1 if i < concurrency % clients else 0) for i in range(clients)]
    procs = [
        ctx.Process(target=_client, args=((Target(base, key, path), share, c, kind, ready, out),))
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
def server(url: str, workers: int) -> Iterator[tuple[str, int]]:
    """`sinal serve` on a free port; its base URL and pid."""
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
        yield base, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _processes() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds, command line), from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[int, float, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        found[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
                                  cmdline)  # fmt: skip
    return found


def cpu_seconds(server_pid: int, database: str) -> tuple[float, float]:
    """CPU seconds so far of the server (with its workers) and of the database's backends.
    Sampled before and after a phase: unlike wall time, barely moved by other load."""
    procs = _processes()
    tree = {server_pid}
    for _ in range(3):  # workers are children (uvicorn's supervisor) or grandchildren
        tree |= {pid for pid, (parent, _, _) in procs.items() if parent in tree}
    server = sum(procs[pid][1] for pid in tree if pid in procs)
    backends = sum(cpu for _, cpu, cmd in procs.values() if f" {database} " in f"{cmd} ")
    return server, backends


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
        events = [event(contacts, n, rng) for n in range(args.single + args.batches * BATCH)]
        # Serialized up front: producing JSON is not what is measured.
        single = [orjson.dumps(e) for e in events[: args.single]]
        rest = events[args.single :]
        batches = [
            orjson.dumps({"events": rest[i : i + BATCH]}) for i in range(0, len(rest), BATCH)
        ]
        drive = {"clients": args.clients, "kind": args.client}
        dbname = urlsplit(url).path.lstrip("/")
        with server(url, args.workers) as (base, pid):
            load(base, key, single[:WARMUP], "/v1/events", concurrency=args.concurrency, **drive)
            measured = single[WARMUP:]
            console.log(f"{backend}: {len(measured):,} single events, {args.concurrency} in flight")
            before = cpu_seconds(pid, dbname)
            wall, lat, errors = load(
                base, key, measured, "/v1/events", concurrency=args.concurrency, **drive
            )
            after = cpu_seconds(pid, dbname)
            check(errors)
            phases = [Phase("single", len(measured), len(measured), wall, lat,
                            after[0] - before[0], after[1] - before[1])]  # fmt: skip
            console.log(
                f"{backend}: {len(batches)} batches of {BATCH}, {BATCH_CONCURRENCY} in flight"
            )
            drive["clients"] = min(args.clients, BATCH_CONCURRENCY)
            before = cpu_seconds(pid, dbname)
            wall, lat, errors = load(
                base, key, batches, "/v1/events/batch", concurrency=BATCH_CONCURRENCY, **drive
            )
            after = cpu_seconds(pid, dbname)
            check(errors)
            phases.append(Phase("batch", len(rest), len(batches), wall, lat,
                                after[0] - before[0], after[1] - before[1]))  # fmt: skip
        found = stored(url, account)
        if found != len(events):
            raise SystemExit(f"MISMATCH on {backend}: sent {len(events)} events, stored {found}")
        console.log(f"{backend}: the database holds all {found:,} events")
        return phases


def check(errors: list[str]) -> None:
    """Stop on any request that was not answered 200/201."""
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")


def report(results: dict[Backend, list[Phase]], args: argparse.Namespace, load: str) -> None:
    """A Markdown table (as bench/README.md shows it) and the targets."""
    out = Console(width=200)
    out.print(
        f"{args.workers} server worker(s); {args.clients} {args.client} client process(es), "
        f"{args.concurrency} single requests in flight; load average {load}\n"
    )
    lines = [
        "| backend | route | events | requests | seconds | events/s | p50 ms | p99 ms "
        "| server CPU µs/event | PostgreSQL CPU µs/event |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for backend, phases in results.items():
        for p in phases:
            route = "`POST /v1/events`" if p.name == "single" else f"`/v1/events/batch` ×{BATCH}"
            db = f"{p.cpu_per_event(p.database_cpu):,.0f}" if backend == "postgresql" else "—"
            lines.append(
                f"| {backend} | {route} | {p.events:,} | {p.requests:,} | {p.seconds:.2f} "
                f"| {p.rate:,.0f} | {p.percentile(50):.1f} | {p.percentile(99):.1f} "
                f"| {p.cpu_per_event(p.server_cpu):,.0f} | {db} |"
            )
    out.print("\n".join(lines), markup=False, highlight=False)
    if "postgresql" in results:
        single, batch = results["postgresql"]
        for what, value, ok in (
            ("single events/s ≥ 3,000", single.rate, single.rate >= TARGETS["single"]),
            ("batch events/s ≥ 20,000", batch.rate, batch.rate >= TARGETS["batch"]),
            ("single p99 < 50 ms", single.percentile(99),
             single.percentile(99) < TARGETS["p99_ms"]),
        ):  # fmt: skip
            verdict = "[green]holds[/green]" if ok else "[red]MISSED[/red]"
            out.print(f"postgresql: {what}: {value:,.1f} → {verdict}")


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
    parser.add_argument(
        "--client",
        choices=("httpx", "raw"),
        default="raw",
        help="a minimal asyncio HTTP/1.1 client (default: it leaves the cores to the server), "
        "or httpx.AsyncClient",
    )
    parser.add_argument("--json", action="store_true", help="print only the figures as JSON")
    args = parser.parse_args()
    args.single = (args.single or (3_000 if args.quick else 20_000)) + WARMUP
    args.batches = args.batches or (20 if args.quick else 100)
    return args


def main() -> int:
    """Run the benchmark."""
    args = parse_args()
    backends: list[Backend] = ["postgresql", "sqlite"] if args.backend == "both" else [args.backend]
    before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    results = {b: run_backend(b, args) for b in backends}
    load = f"{before} before, {', '.join(f'{x:.1f}' for x in os.getloadavg())} after"
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    b: {
                        p.name: {
                            "events_per_s": round(p.rate, 1),
                            "p50_ms": round(p.percentile(50), 2),
                            "p99_ms": round(p.percentile(99), 2),
                            "server_cpu_us_per_event": round(p.cpu_per_event(p.server_cpu), 1),
                            "database_cpu_us_per_event": round(p.cpu_per_event(p.database_cpu), 1),
                        }
                        for p in phases
                    }
                    for b, phases in results.items()
                }
            )
            + "\n"
        )
    else:
        report(results, args, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
