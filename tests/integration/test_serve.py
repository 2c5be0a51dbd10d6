"""`sinal serve` as a real process, driven over HTTP; the CLI that makes accounts and keys."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.helpers import free_port, sql, wait_until

SINAL = str(Path(sys.executable).with_name("sinal"))


def cli(env: dict[str, str], *args: str) -> dict[str, str]:
    done = subprocess.run([SINAL, *args, "--json"], env=env, capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    result: dict[str, str] = json.loads(done.stdout)
    return result


def wait_ready(base: str, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "sinal serve exited early"
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("sinal serve did not become ready")


def start_serve(
    env: dict[str, str], cwd: Path, output: int, *args: str
) -> tuple[str, subprocess.Popen[str]]:
    """`sinal serve [args]` on a free port, ready: its base URL and process (stdout and
    stderr to `output`: subprocess.PIPE or DEVNULL). Killed if it never gets ready."""
    port = free_port()
    proc = subprocess.Popen(
        [SINAL, "serve", "--port", str(port), *args], env=env, cwd=cwd, text=True,
        stdout=output, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
    except BaseException:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        raise
    return base, proc


@contextmanager
def serving(env: dict[str, str], cwd: Path) -> Iterator[str]:
    """`sinal serve` on a free port, ready; its base URL. Stopped (SIGTERM) on exit."""
    base, proc = start_serve(env, cwd, subprocess.DEVNULL)
    try:
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    return {**os.environ, "SINAL_DATABASE_URL": database_url, "SINAL_AUTH_CACHE_TTL": "0"}


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    base, proc = start_serve(env, tmp_path, subprocess.PIPE)
    try:
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.mark.slow
def test_serve_records_and_answers_over_http_and_honours_revocation(
    env: dict[str, str], server: tuple[str, subprocess.Popen[str]]
) -> None:
    base, proc = server
    account = cli(env, "accounts", "create", "--name", "Loja Exemplo")
    key = cli(env, "keys", "create", "--account", account["id"], "--scopes", "ingest,read")
    headers = {"Authorization": f"Bearer {key['key']}"}

    created = httpx.post(f"{base}/v1/events", headers=headers, json={
        "metric": "Order Paid", "contact": {"phone": "+55 11 98765-4321"}, "value": "297.90",
        "source": "shopify", "source_id": "1001", "entity_type": "order",
    })  # fmt: skip
    listed = httpx.get(f"{base}/v1/events", headers=headers, params={"metric": "Order Paid"})
    cli(env, "keys", "revoke", key["id"])
    revoked = httpx.get(f"{base}/v1/events", headers=headers)

    assert created.status_code == 201, created.text
    assert [e["id"] for e in listed.json()["data"]] == [created.json()["event_id"]]
    assert revoked.status_code == 401
    proc.send_signal(signal.SIGTERM)  # a graceful stop: in-flight events drained first
    # uvicorn re-raises the signal it handled once it has shut down cleanly.
    assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
    assert proc.stdout is not None
    assert "Application shutdown complete." in proc.stdout.read()


@pytest.mark.slow
def test_serve_counts_a_client_gone_mid_body_as_499_without_a_traceback(
    env: dict[str, str], server: tuple[str, subprocess.Popen[str]]
) -> None:
    base, proc = server
    account = cli(env, "accounts", "create", "--name", "Loja Exemplo")
    key = cli(env, "keys", "create", "--account", account["id"], "--scopes", "ingest,read")
    port = int(base.rsplit(":", 1)[1])
    for path in ("/v1/events", "/v1/events/batch"):  # the fast path and FastAPI's
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key['key']}\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                '{"metric": "Order Paid", "co'.encode()
            )  # fmt: skip
            time.sleep(0.2)  # the server reads the start of the body, then the client leaves

    def counted() -> list[str]:
        lines = httpx.get(f"{base}/metrics").text.splitlines()
        return [x for x in lines if x.startswith("sinal_http_requests_total") and "/v1/ev" in x]

    wait_until(lambda: len(counted()) == 2)
    assert sorted(counted()) == [
        'sinal_http_requests_total{method="POST",route="/v1/events",status="499"} 1.0',
        'sinal_http_requests_total{method="POST",route="/v1/events/batch",status="499"} 1.0',
    ]
    assert sql(env["SINAL_DATABASE_URL"], "SELECT count(*) FROM events") == [(0,)]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)
    assert proc.stdout is not None
    output = proc.stdout.read()
    assert "Traceback" not in output
    assert "Application shutdown complete." in output


@pytest.mark.slow
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])  # ::1's line said http://::1:8000
def test_serve_demo_prints_a_key_and_a_curl_line_that_works(tmp_path: Path, host: str) -> None:
    port = free_port()
    env = {**os.environ, "SINAL_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}"}
    serve = [SINAL, "serve", "--demo", "--port", str(port), "--host", host]
    proc = subprocess.Popen(serve, env=env,
                            cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(7)]
        wait_ready(f"http://{'[::1]' if host == '::1' else host}:{port}", proc)
        [curl] = [line.strip() for line in lines if line.strip().startswith("curl -sS -X POST")]
        done = subprocess.run(
            ["bash", "-c", curl], capture_output=True, text=True, timeout=30, check=False
        )
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()

    assert re.fullmatch(r"\s*snl_[0-9a-f]{32}_[0-9A-Za-z]{43}\s*", lines[1])
    assert json.loads(done.stdout)["status"] == "created", done.stdout + done.stderr


@pytest.mark.slow
def test_serve_demo_on_a_database_with_accounts_prints_a_command_that_runs(
    tmp_path: Path,
) -> None:
    """`make run` again: the line it printed, `sinal keys create …`, was "command not
    found", as `make` runs `.venv/bin/sinal`, which is not on the PATH."""
    env = {**os.environ, "SINAL_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}"}
    subprocess.run([SINAL, "migrate"], env=env, capture_output=True, check=True, timeout=60)
    account = cli(env, "accounts", "create", "--name", "Loja")
    proc = subprocess.Popen([SINAL, "serve", "--demo", "--port", str(free_port())], env=env,
                            cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()
    command = lines[1].strip()
    done = subprocess.run(["bash", "-c", command], env={**env, "PATH": "/usr/bin:/bin"},
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip

    assert lines[0] == "The database already has accounts; make a key with:\n"
    assert done.returncode == 0, command + "\n" + done.stderr
    assert f"(ingest, read, admin) for account {account['id']}:" in done.stdout  # as the demo's
    assert re.search(r"^snl_[0-9a-f]{32}_[0-9A-Za-z]{43}$", done.stdout, re.MULTILINE)


@pytest.mark.slow
def test_serve_logs_its_worker_as_uvicorn_logs_itself(
    server: tuple[str, subprocess.Popen[str]],
) -> None:
    """The worker inside `sinal serve` logged nothing at info (its start and stop,
    abandoned checkouts recorded, rows pruned), and its warnings had no level."""
    _, proc = server
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)
    assert proc.stdout is not None
    output = proc.stdout.read()

    assert re.search(r"^INFO: +worker \S+ started$", output, re.MULTILINE), output
    assert re.search(r"^INFO: +worker \S+ stopped$", output, re.MULTILINE), output


@pytest.mark.slow
def test_serve_access_log_keeps_no_secret_of_a_query_string(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`--access-log` logged the request line as sent: a WhatsApp handshake's
    `hub.verify_token`, and an API key sent as `?api_key=`, in clear."""
    base, proc = start_serve(env, tmp_path, subprocess.PIPE, "--access-log")
    try:
        unknown = "0190f0f0-0000-7000-8000-000000000000"
        httpx.get(f"{base}/webhooks/whatsapp/{unknown}?hub.mode=subscribe"
                  "&hub.verify_token=sekret-token&hub.challenge=42", timeout=10)  # fmt: skip
        httpx.get(f"{base}/v1/account?api_key=snl_sekret_key&x=1", timeout=10)
        httpx.get(f"{base}/v1/account?x=1&api%5Fkey=sekret2", timeout=10)  # as Starlette reads
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    assert proc.stdout is not None
    output = proc.stdout.read()
    proc.stdout.close()

    assert "sekret" not in output, output
    assert "hub.verify_token=***&hub.challenge=42" in output, output
    assert "/v1/account?api_key=***&x=1" in output, output
    assert "/v1/account?x=1&api%5Fkey=***" in output, output


@pytest.mark.slow
def test_serve_runs_automations_in_its_own_worker(env: dict[str, str], tmp_path: Path) -> None:
    from tests.servers import whatsapp_server

    env = {**env, "SINAL_ALLOW_PRIVATE_WEBHOOKS": "true", "SINAL_WORKER_POLL_INTERVAL": "0.2"}
    account = cli(env, "accounts", "create", "--name", "Loja")
    key = cli(env, "keys", "create", "--account", account["id"], "--scopes", "ingest,read,admin")
    headers = {"Authorization": f"Bearer {key['key']}"}
    with serving(env, tmp_path) as base, whatsapp_server() as (wa_url, wa):
        made = httpx.post(f"{base}/v1/integrations", headers=headers, json={
            "kind": "whatsapp", "secret": "s", "phone_number_id": "77",
            "access_token": "t", "api_base_url": wa_url})  # fmt: skip
        assert made.status_code == 201, made.text
        step = {"type": "send_message", "text": "Obrigado, {{ contact.name }}!"}
        automation = httpx.post(f"{base}/v1/automations", headers=headers, json={
            "name": "oi", "trigger_metric": "Order Paid", "steps": [step]})  # fmt: skip
        assert automation.status_code == 201, automation.text
        sent = httpx.post(f"{base}/v1/events", headers=headers, json={
            "metric": "Order Paid", "source": "shopify", "source_id": "9",
            "contact": {"phone": "+55 11 98765-4321", "name": "Ana"}})  # fmt: skip
        assert sent.status_code == 201, sent.text
        wait_until(lambda: wa.requests, timeout=30)
        [message] = wa.bodies("/77/messages")
        assert message["text"]["body"] == "Obrigado, Ana!"

        counted = 'sinal_worker_steps_total{status="completed",type="send_message"} 1.0'
        # counted once the step's record is committed, after the send
        wait_until(lambda: counted in httpx.get(f"{base}/metrics").text, timeout=30)
        metrics = httpx.get(f"{base}/metrics").text
        assert counted in metrics
        assert "sinal_worker_executions_created_total 1.0" in metrics
        assert "sinal_outbox_rows 0.0" in metrics


@pytest.mark.slow
def test_serve_records_an_abandoned_checkout_with_no_command_run(
    env: dict[str, str], tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta

    from sinal.integrations import sign_shopify

    env = {**env, "SINAL_HOUSEKEEPING_INTERVAL": "1"}
    account = cli(env, "accounts", "create", "--name", "Loja")
    key = cli(env, "keys", "create", "--account", account["id"], "--scopes", "read,admin")
    headers = {"Authorization": f"Bearer {key['key']}"}
    fixtures = Path(__file__).parent.parent / "fixtures" / "shopify"
    checkout = json.loads((fixtures / "checkouts_create.json").read_text())
    # last updated 10 minutes ago; the shortest delay (5 minutes) has passed
    checkout["updated_at"] = (datetime.now(UTC) - timedelta(minutes=10)).isoformat()
    body = json.dumps(checkout).encode()
    with serving(env, tmp_path) as base:
        made = httpx.post(f"{base}/v1/integrations", headers=headers, json={
            "kind": "shopify", "secret": "shpss_1", "abandon_after_minutes": 5})  # fmt: skip
        assert made.status_code == 201, made.text
        delivered = httpx.post(made.json()["webhook_url"], content=body, headers={
            "Content-Type": "application/json", "X-Shopify-Topic": "checkouts/create",
            "X-Shopify-Hmac-Sha256": sign_shopify("shpss_1", body),
            "X-Shopify-Webhook-Id": "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"})  # fmt: skip
        assert delivered.json()["status"] == "processed", delivered.text
        deadline = time.monotonic() + 30
        found: list[dict[str, Any]] = []
        while not found and time.monotonic() < deadline:
            time.sleep(0.2)
            listed = httpx.get(f"{base}/v1/events", headers=headers,
                               params={"metric": "Checkout Abandoned"})  # fmt: skip
            found = listed.json()["data"]

    [abandoned] = found
    assert abandoned["properties"]["checkout_url"].endswith("/recover?key=8d2e6f0a1b9c4d7e")


def _server_processes(supervisor: int) -> set[int]:
    """The pids of uvicorn's server processes under `sinal serve` (its spawned children)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return {
        int(pid)
        for pid in children
        if b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
        and b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    }


def _listeners(url: str) -> set[int]:
    """The sessions of the database at `url` whose last statement was a worker's LISTEN
    (another database's, a server another test or person runs, are not this server's)."""
    rows = sql(url, "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN sinal_executions' "
                    "AND datname = current_database()")  # fmt: skip
    return {pid for (pid,) in rows}


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_killed_server_process_leaves_the_live_gauges(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Each server process runs a worker, listening on PostgreSQL: `sinal_worker_listening`
    # adds up the live ones. A process killed with -9 cannot take its figure away, and
    # uvicorn replaces it: the sum said 3 of 2 processes until a scrape forgot the dead.
    env = {**env, "SINAL_WORKERS": "2"}
    base, proc = start_serve(env, tmp_path, subprocess.DEVNULL)
    try:
        listening = "sinal_worker_listening 2.0"
        wait_until(lambda: listening in httpx.get(f"{base}/metrics").text, timeout=30)
        assert listening in httpx.get(f"{base}/metrics").text
        first = _server_processes(proc.pid)
        assert len(first) == 2

        before = _listeners(env["SINAL_DATABASE_URL"])
        assert len(before) == 2
        os.kill(min(first), signal.SIGKILL)
        # the new process's worker listens (the dead one's session ended)
        wait_until(lambda: len(_listeners(env["SINAL_DATABASE_URL"]) - before) == 1, timeout=30)
        assert len(_listeners(env["SINAL_DATABASE_URL"])) == 2
        # its gauge is set right after its LISTEN; once 2, the sum stays 2 (3 before)
        wait_until(lambda: listening in httpx.get(f"{base}/metrics").text, timeout=10)
        time.sleep(0.5)
        metrics = httpx.get(f"{base}/metrics").text
    finally:
        proc.terminate()
        proc.wait(timeout=15)

    assert listening in metrics, [m for m in metrics.splitlines() if "listening" in m]


def _two_webhooks(env: dict[str, str], base: str, hook_url: str) -> dict[str, str]:
    """An account whose automation posts two webhooks for each Ping; its key's headers."""
    account = cli(env, "accounts", "create", "--name", "Loja")
    key = cli(env, "keys", "create", "--account", account["id"], "--scopes", "ingest,read,admin")
    headers = {"Authorization": f"Bearer {key['key']}"}
    made = httpx.post(f"{base}/v1/automations", headers=headers, json={
        "name": "a", "trigger_metric": "Ping",
        "steps": [{"type": "webhook", "url": f"{hook_url}/one"},
                  {"type": "webhook", "url": f"{hook_url}/two"}]})  # fmt: skip
    assert made.status_code == 201, made.text
    return headers


@pytest.mark.slow
def test_serve_stopped_mid_step_starts_no_other_and_gives_the_rest_back(
    env: dict[str, str], tmp_path: Path
) -> None:
    """SIGTERM while the worker inside `sinal serve` runs step one of two: step one finishes
    and is recorded, step two does not start (it used to, ~20 s later, then the ledger was
    closed under it and, after a restart, it ran again); the execution is given back, so
    the next server goes on with step two at once, not after the (ten-minute) lease."""
    from tests.servers import webhook_receiver

    env = {**env, "SINAL_ALLOW_PRIVATE_WEBHOOKS": "true", "SINAL_WORKER_POLL_INTERVAL": "0.2",
           "SINAL_WORKER_LEASE": "600"}  # fmt: skip
    with webhook_receiver() as (hook_url, hook):
        base, proc = start_serve(env, tmp_path, subprocess.DEVNULL)
        try:
            headers = _two_webhooks(env, base, hook_url)
            hook.behaviour.delay = 2.0
            ping = {"metric": "Ping", "contact": {"phone": "+5511987654321"}}
            sent = httpx.post(f"{base}/v1/events", headers=headers, json=ping)
            assert sent.status_code == 201, sent.text
            wait_until(lambda: hook.requests, timeout=30)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        url = env["SINAL_DATABASE_URL"]
        assert [r["path"] for r in hook.requests] == ["/one"]
        assert sql(url, "SELECT status, next_step, claimed_by FROM executions") == [
            ("pending", 1, None)
        ]
        assert sql(url, "SELECT step_index, status FROM execution_steps") == [(0, "completed")]

        hook.behaviour.delay = 0
        with serving(env, tmp_path):
            wait_until(lambda: len(hook.requests) == 2, timeout=30)
            wait_until(lambda: sql(url, "SELECT status FROM executions") == [("completed",)])
        assert [r["path"] for r in hook.requests] == ["/one", "/two"]
        assert sql(url, "SELECT status FROM executions") == [("completed",)]


@pytest.mark.slow
def test_worker_stops_after_the_running_step_and_at_once_on_a_second_signal(
    env: dict[str, str], tmp_path: Path
) -> None:
    """SIGTERM: `sinal worker` finishes the step running (one thread: the other execution
    waits for it), starts no other and gives both executions back; a second SIGTERM ends
    it at once, as a kill would, where it used to wait for every execution in hand."""
    from tests.servers import webhook_receiver

    env = {**env, "SINAL_ALLOW_PRIVATE_WEBHOOKS": "true", "SINAL_WORKER_POLL_INTERVAL": "0.2",
           "SINAL_WORKER_LEASE": "600", "SINAL_SERVE_WORKER": "false",
           "SINAL_WORKER_CONCURRENCY": "1"}  # fmt: skip
    with webhook_receiver() as (hook_url, hook), serving(env, tmp_path) as base:
        headers = _two_webhooks(env, base, hook_url)
        for n in range(2):
            ping = {"metric": "Ping", "source_id": str(n), "contact": {"phone": "+5511987654321"}}
            sent = httpx.post(f"{base}/v1/events", headers=headers, json=ping)
            assert sent.status_code == 201, sent.text
        url = env["SINAL_DATABASE_URL"]
        ended = []
        for delay, signals in ((1.0, 1), (60.0, 2)):
            hook.behaviour.delay = delay
            seen = len(hook.requests)
            worker = subprocess.Popen(
                [SINAL, "worker"], env=env, cwd=tmp_path, stderr=subprocess.DEVNULL
            )
            try:
                wait_until(lambda: len(hook.requests) > seen, timeout=30)  # noqa: B023
                began = time.monotonic()
                for _ in range(signals):
                    time.sleep(0.3)
                    worker.send_signal(signal.SIGTERM)
                ended.append((worker.wait(timeout=30), time.monotonic() - began < 10))
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait(timeout=10)
            if signals == 1:  # the step ran to its end; the next did not start
                assert [r["path"] for r in hook.requests] == ["/one"]
                assert sql(url, "SELECT count(*) FROM executions WHERE claimed_by IS NULL "
                                "AND status = 'pending'") == [(2,)]  # fmt: skip
    assert ended == [(0, True), (-signal.SIGTERM, True)]


@contextmanager
def logging_worker(env: dict[str, str], cwd: Path) -> Iterator[Path]:
    """`sinal worker`, started (its first line written); the file of its log. Stopped
    (SIGTERM, exit 0) on exit, its log then complete."""
    log = cwd / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen([SINAL, "worker"], env=env, cwd=cwd, stderr=out)
    try:
        wait_until(lambda: " started" in log.read_text(), timeout=30)
        yield log
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)


# A line of `sinal worker`'s log: its time, level and logger, then the message.
WORKER_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) (\S+): (.*)$")


@pytest.mark.slow
def test_worker_logs_each_line_with_its_level_and_logger(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`sinal worker`'s lines said no level: a warning read as any other line."""
    with logging_worker(env, tmp_path) as log:
        pass
    lines = log.read_text().splitlines()

    matched = [WORKER_LINE.match(line) for line in lines]
    assert all(matched), lines
    said = [(m[1], m[2], re.sub(r"worker \S+", "worker W", m[3].split(": ")[0]))
            for m in matched if m]  # fmt: skip
    assert said == [
        ("INFO", "sinal.dispatcher", "worker W started"),
        ("INFO", "sinal.worker", "SIGTERM"),
        ("INFO", "sinal.dispatcher", "worker W stopped"),
    ]


@pytest.mark.slow
@pytest.mark.postgres
def test_worker_logs_a_database_outage_once_not_at_every_attempt(
    pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL refusing connections for 6 s: `sinal worker` logged a line at every poll
    of its loop, and psycopg's pool one for every attempt to connect, bare, with no level
    (~80 lines here); now one as it begins, one as it ends, and the loop's once per 10 s."""
    from tests.conftest import PG_URL

    env = {**os.environ, "SINAL_DATABASE_URL": pg_url, "SINAL_WORKER_POLL_INTERVAL": "0.1",
           "SINAL_DATABASE_WAIT": "1", "SINAL_HOUSEKEEPING_INTERVAL": "0"}  # fmt: skip
    name = pg_url.rsplit("/", 1)[1]

    def allow(allowed: bool) -> None:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {allowed}')
            if not allowed:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = %s", (name,))  # fmt: skip

    with logging_worker(env, tmp_path) as log:
        allow(False)
        time.sleep(6)
        allow(True)
        wait_until(lambda: "connected to PostgreSQL again" in log.read_text(), timeout=30)
    # a record's lines (libpq's messages go on over more: "\tThis probably means ...")
    lines = [line for line in log.read_text().splitlines() if re.match(r"\d{4}-", line)]

    assert not [line for line in lines if "error connecting" in line]
    assert len([line for line in lines if "cannot connect to PostgreSQL:" in line]) == 1, lines
    assert len([line for line in lines if "connected to PostgreSQL again" in line]) == 1, lines
    assert len([line for line in lines if "unreachable for" in line]) <= 1, lines
    assert len(lines) <= 15, lines
    assert all(WORKER_LINE.match(line) for line in lines), lines
