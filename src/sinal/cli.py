"""The commands a person types: `sinal serve`, `sinal migrate`, `sinal accounts …`,
`sinal keys …`, `sinal contacts …`, `sinal demo`, `sinal rebuild-summaries`, `sinal prune`."""

from __future__ import annotations

import copy
import errno
import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import Annotated, Any, cast
from uuid import UUID

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandFunctionType

from sinal.config import Settings
from sinal.errors import (
    AccountNotFound,
    ConfigurationError,
    InvalidQuery,
    SchemaOutOfDate,
    SinalError,
    StoreError,
)
from sinal.keyring import Keyring
from sinal.ledger import Ledger, connect, contact_query
from sinal.store.base import (
    ContactQuery,
    ListedContact,
    RebuildReport,
    latest_schema_version,
    read_pages,
)


def _untyped_flags(params: Iterable[Any]) -> None:
    """A flag (--json, --help, --migrate/--no-migrate) takes no value: shown with no type
    in --help, where typer put `<bool>` beside each, as if it took one."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


class _Command(TyperCommand):
    """A command whose --help shows its flags with no type."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _untyped_flags(self.get_params(ctx))
        super().format_help(ctx, formatter)


class _Group(TyperGroup):
    """A group of commands whose --help shows its flags with no type."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _untyped_flags(self.get_params(ctx))
        super().format_help(ctx, formatter)


class _Typer(typer.Typer):
    """`typer.Typer` whose groups and commands show their flags with no type."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(cls=_Group, **settings)

    def command(
        self, *args: Any, **settings: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        """`typer.Typer.command`, of class `_Command`."""
        return super().command(*args, cls=_Command, **settings)


app = _Typer(
    name="sinal",
    help="sinal: the event system of a commerce + WhatsApp CRM platform.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# No markup, no :emoji: codes: what is printed quotes names, metrics and errors people typed
# ("Loja [/b]" raised MarkupError, "Loja [promo]" printed as "Loja "); style with style=.
# soft_wrap: a message is one line in a narrow terminal, a log or a pipe (80 columns to rich).
console = Console(markup=False, emoji=False, soft_wrap=True)
err_console = Console(stderr=True, markup=False, emoji=False)

TRACE_LOG_LEVEL = 5  # uvicorn.logging.TRACE_LOG_LEVEL, without importing uvicorn for it
WORKER_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        metavar="URL",
        envvar="SINAL_DATABASE_URL",
        help="sqlite:///file.db or postgresql://user@host:port/db (default: sqlite:///sinal.db)",
        show_default=False,
    ),
]


def open_ledger(database_url: str | None, *, is_migrating: bool = False) -> Ledger:
    """The ledger for a command: --database-url, else SINAL_DATABASE_URL, else the default.
    `SchemaOutOfDate` (run `sinal migrate`) unless its migrations are applied, or the command
    applies them itself (`is_migrating`): a raw "no such table" helps nobody. Only a
    command that migrates creates a SQLite file: a typo in the path makes none."""
    settings = Settings.from_env().with_overrides(database_url=database_url)
    ledger = connect(settings.database_url, wait=settings.database_wait, create=is_migrating,
                     keyring=settings.keyring())  # fmt: skip
    if not is_migrating:
        try:
            ledger.check_schema()
        except BaseException:
            ledger.close()
            raise
    return ledger


@app.command()
def migrate(database_url: DatabaseOption = None) -> None:
    """Apply pending schema migrations (idempotent) and print the schema version."""
    with open_ledger(database_url, is_migrating=True) as ledger:
        applied = ledger.migrate()
        version = ledger.schema_version()
        latest = latest_schema_version(getattr(ledger.store, "backend", "sqlite"))
    if applied:
        console.print(
            f"applied migrations {', '.join(map(str, applied))}; schema version {version}"
        )
    elif version > latest:  # newer code migrated it (a rolling deploy); this code runs on it
        console.print(
            f"schema version {version} is newer than this code's ({latest}): nothing to apply"
        )
    else:
        console.print(f"schema is up to date (version {version})")


@app.command("rebuild-summaries")
def rebuild_summaries(
    database_url: DatabaseOption = None,
    account: Annotated[
        str | None, typer.Option(metavar="ID", help="Only this account's summaries (default: all).")
    ] = None,
) -> None:
    """Recompute contact_metrics_summary from the events table and report the drift fixed."""
    account_id = None if account is None else _parse_id(account, "--account")
    with open_ledger(database_url) as ledger:
        _check_account(ledger, account_id)  # before the progress bar, which ends in a newline
        with _progress() as progress:
            task = progress.add_task("rebuilding summaries, contacts", total=None)

            def advance(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            accounts, total = _added_up(ledger.rebuild_each_account(account_id, advance))
    for line in total.details:  # after the bar: while it runs, stdout goes through it
        console.print(f"  {line}")
    console.print(
        f"{accounts} account(s), {total.rows} summary rows; fixed {total.drift} drifted row(s)"
        + (
            f" ({total.inserted} missing, {total.changed} wrong, {total.deleted} orphaned)"
            if total.drift
            else ""
        )
    )


def _added_up(reports: Iterable[RebuildReport]) -> tuple[int, RebuildReport]:
    """How many accounts were rebuilt, and their reports added up, each detail naming its
    account: only the details are held, not a report per account."""
    accounts, total = 0, RebuildReport(UUID(int=0))
    for report in reports:
        accounts += 1
        report.details = [f"account {report.account_id}: {line}" for line in report.details]
        total.add(report)
    return accounts, total


@app.command()
def demo(database_url: DatabaseOption = None) -> None:
    """Create an account and contacts, emit a realistic sequence, and show what was stored."""
    from sinal.demo import run_demo

    with open_ledger(database_url, is_migrating=True) as ledger:
        ledger.migrate()
        run_demo(ledger, Console())  # its tables style fixed text with markup


accounts_app = _Typer(help="Accounts (tenants).", no_args_is_help=True)
keys_app = _Typer(help="API keys: the text is shown once; only its hash is kept.",
                       no_args_is_help=True)  # fmt: skip
app.add_typer(accounts_app, name="accounts")
app.add_typer(keys_app, name="keys")
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")]


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, ensure_ascii=False))


Row = dict[str, Any]


def _print_pages(
    name: str, pages: Iterable[list[Row]], line: Callable[[Row], str] | None, empty: str
) -> None:
    """Print a list's rows as each page (never empty) is read, so that only one page is
    held: with `line` None, as `_echo_json({name: rows})` prints them all (one JSON
    object), else `line(row)` for each, and `empty` on stderr when there is none (an
    empty stdout read as a command that did nothing). A failure past the first page
    leaves what was printed (and exits 1)."""
    if line is None:
        opening, started = f"{{{json.dumps(name)}: [", False
        for page in pages:
            rows = ", ".join(json.dumps(row, ensure_ascii=False) for row in page)
            typer.echo((", " if started else opening) + rows, nl=False)
            started = True
        typer.echo(("" if started else opening) + "]}")
        return
    printed = False
    for page in pages:  # one print a page: rich's own work per call is most of a row's
        console.print("\n".join(line(row) for row in page))
        printed = True
    if not printed:
        err_console.print(empty, soft_wrap=True)


@accounts_app.command("create")
def accounts_create(
    name: Annotated[str, typer.Option(metavar="NAME", help="The account's name.")],
    timezone: Annotated[
        str, typer.Option(metavar="ZONE", help="IANA zone: the default of aggregates.")
    ] = "America/Sao_Paulo",
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Create an account; prints its id."""
    with open_ledger(database_url) as ledger:
        account = ledger.create_account(name, timezone=timezone)
    if as_json:
        _echo_json({"id": str(account.id), "name": account.name, "timezone": account.timezone})
    else:
        console.print(f"created account {account.name!r}: {account.id}")


# Accounts read per query by `accounts list`, which pages through every one (it stopped,
# unsaid, at the first 10,000), printing each page as it is read.
ACCOUNTS_PAGE = 1000


@accounts_app.command("list")
def accounts_list(as_json: JsonOption = False, database_url: DatabaseOption = None) -> None:
    """List every account, oldest first."""
    with open_ledger(database_url) as ledger:
        pages = (
            [{"id": str(a.id), "name": a.name, "timezone": a.timezone} for a in page]
            for page in read_pages(partial(ledger.list_accounts, ACCOUNTS_PAGE), ACCOUNTS_PAGE)
        )
        empty = f"no accounts: create one with `{_this_command()} accounts create --name NAME`"
        _print_pages("accounts", pages, None if as_json else _account_line, empty)


def _account_line(row: Row) -> str:
    return f"{row['id']}  {row['name']}  ({row['timezone']})"


@keys_app.command("create")
def keys_create(
    account: Annotated[str, typer.Option(metavar="ID", help="The account's id.")],
    scopes: Annotated[
        str, typer.Option(metavar="SCOPES", help="Comma-separated: ingest, read, admin.")
    ] = ("ingest,read"),
    name: Annotated[str | None, typer.Option(metavar="NAME", help="A label for the key.")] = None,
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Create an API key; its text is printed once and cannot be shown again."""
    from sinal.auth import parse_scopes

    try:
        wanted = parse_scopes(scopes)
        account_id = _parse_id(account, "--account")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with open_ledger(database_url) as ledger:
        text, key = ledger.create_api_key(account_id, wanted, name)
    if as_json:
        _echo_json({"key": text, "id": str(key.id), "account_id": str(key.account_id),
                    "scopes": list(key.scopes)})  # fmt: skip
    else:
        typer.echo(f"key {key.id} ({', '.join(key.scopes)}) for account {key.account_id}:")
        typer.echo(text)
        err_console.print("store it now: it is not shown again", style="yellow")


# Keys read per query by `keys list`, which pages through every one of the account's,
# printing each page as it is read.
KEYS_PAGE = 1000


@keys_app.command("list")
def keys_list(
    account: Annotated[str, typer.Option(metavar="ID", help="The account's id.")],
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """List an account's keys, oldest first (ids, scopes, last characters; never the text)."""
    account_id = _parse_id(account, "--account")
    with open_ledger(database_url) as ledger:
        _check_account(ledger, account_id)
        pages = (
            [{"id": str(k.id), "name": k.name, "scopes": list(k.scopes), "hint": f"…{k.hint}",
              "revoked": k.revoked_at is not None} for k in page]
            for page in read_pages(partial(ledger.list_api_keys, account_id, KEYS_PAGE), KEYS_PAGE)
        )  # fmt: skip
        empty = (f"account {account_id} has no keys: create one with "
                 f"`{_this_command()} keys create --account {account_id}`")  # fmt: skip
        _print_pages("keys", pages, None if as_json else _key_line, empty)


def _key_line(row: Row) -> str:
    state = "revoked" if row["revoked"] else "active"
    label = "" if row["name"] is None else f"  {row['name']}"  # --name's label: which is which
    return f"{row['id']}  {row['hint']}  {','.join(row['scopes'])}  {state}{label}"


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[
        str, typer.Argument(metavar="KEY_ID", help="The key's id (from keys create or list).")
    ],
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Revoke a key: it answers 401 within SINAL_AUTH_CACHE_TTL seconds (default 2)."""
    with open_ledger(database_url) as ledger:
        key = ledger.revoke_api_key(_parse_id(key_id, "KEY_ID"))
    if key is None:
        _print_error(f"no key {key_id}")
        raise typer.Exit(1)
    if as_json:
        _echo_json({"id": str(key.id), "revoked": True})
    else:
        console.print(f"revoked key {key.id} of account {key.account_id}")


contacts_app = _Typer(help="Contacts.", no_args_is_help=True)
app.add_typer(contacts_app, name="contacts")


# Contacts read per query by `contacts list`, which pages through every one matching,
# printing each page as it is read.
CONTACTS_PAGE = 1000


@contacts_app.command("list")
def contacts_list(
    *,
    account: Annotated[
        str, typer.Option(metavar="ID", help="The contacts' account.", show_default=False)
    ],
    phone: Annotated[
        str | None, typer.Option(metavar="PHONE", help="Only the contact with this phone.")
    ] = None,
    email: Annotated[
        str | None, typer.Option(metavar="EMAIL", help="Only the contact with this email.")
    ] = None,
    external_id: Annotated[
        str | None, typer.Option(metavar="ID", help="Only the contact with this external id.")
    ] = None,
    tag: Annotated[
        str | None, typer.Option(metavar="TAG", help="Only contacts with this tag.")
    ] = None,
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """List an account's contacts, oldest first, as GET /v1/contacts.

    Every one, or those with a phone, email, external id or tag (compared as contacts
    store them)."""
    from sinal.api.views import contact_view

    account_id = _parse_id(account, "--account")
    try:
        query = contact_query(account_id, phone=phone, email=email, external_id=external_id,
                              tag=tag, limit=CONTACTS_PAGE)  # fmt: skip
    except InvalidQuery as exc:
        raise typer.BadParameter(str(exc)) from None
    with open_ledger(database_url) as ledger:
        _check_account(ledger, account_id)
        pages = (
            [contact_view(c.contact, c.tags) for c in page]
            for page in read_pages(partial(_contacts_after, ledger, query), query.limit)
        )
        given = {"--phone": phone, "--email": email, "--external-id": external_id, "--tag": tag}
        _print_pages("contacts", pages, None if as_json else _contact_line,
                     _no_contacts(account_id, given))  # fmt: skip


def _no_contacts(account_id: Any, given: dict[str, str | None]) -> str:
    """What `contacts list` says when it lists none: of the account, or matching the
    filters given (as typed)."""
    filters = [f"{option} {shlex.quote(value)}" for option, value in given.items()
               if value is not None]  # fmt: skip
    if not filters:
        return f"account {account_id} has no contacts"
    return f"no contact of account {account_id} matches {' '.join(filters)}"


def _contacts_after(
    ledger: Ledger, query: ContactQuery, last: ListedContact | None
) -> list[ListedContact]:
    """The page of `query`'s contacts after `last` (None: the first)."""
    return ledger.list_contacts(replace(query, after=None if last is None else last.id))


def _contact_line(row: Row) -> str:
    fields = [row["name"], row["phone"], row["email"], row["external_id"]]
    tags = f"  [{', '.join(row['tags'])}]" if row["tags"] else ""
    return "  ".join([row["id"], *(f or "-" for f in fields)]) + tags


@contacts_app.command("older-spellings")
def contacts_older_spellings(
    *,
    account: Annotated[
        str, typer.Option(metavar="ID", help="The contacts' account.", show_default=False)
    ],
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """List the identities migration 0032 left as stored.

    Emails and external ids in an older spelling, each refused now or, in its form now,
    another contact's: merging is a person's decision (README, "Identities")."""
    account_id = _parse_id(account, "--account")
    with open_ledger(database_url) as ledger:
        _check_account(ledger, account_id)
        left = ledger.older_spellings(account_id)
    rows = [{"contact_id": str(u.contact_id), "kind": u.kind, "value": u.value,
             "reason": u.reason, "holders": [str(h) for h in u.holders]}
            for u in left]  # fmt: skip
    empty = f"account {account_id} has no email or external id in an older spelling"
    _print_pages("identities", [rows] if rows else [], None if as_json else _spelling_line, empty)


def _spelling_line(row: Row) -> str:
    """One line of `contacts older-spellings`: contact, kind, value, reason, holders."""
    holders = f" (also {', '.join(row['holders'])})" if row["holders"] else ""
    return f"{row['contact_id']}  {row['kind']}  {row['value']}  {row['reason']}{holders}"


@contacts_app.command("erase", short_help="Erase a contact and everything of it, irreversibly.")
def contacts_erase(
    contact: Annotated[
        str, typer.Argument(metavar="CONTACT_ID", help="The contact's id.", show_default=False)
    ],
    account: Annotated[
        str, typer.Option(metavar="ID", help="The contact's account.", show_default=False)
    ],
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Erase a contact and everything of it, irreversibly: as DELETE /v1/contacts/{id}
    (README, "Erasing a contact")."""
    account_id = _parse_id(account, "--account")
    contact_id = _parse_id(contact, "CONTACT_ID")
    with open_ledger(database_url) as ledger:
        _check_account(ledger, account_id)
        erased = ledger.erase_contact(account_id, contact_id)
    if not erased:
        _print_error(f"no contact {contact_id} in account {account_id}")
        raise typer.Exit(1)
    if as_json:
        _echo_json({"id": str(contact_id), "erased": True})
    else:
        console.print(f"erased contact {contact_id} of account {account_id}")


def _parse_id(raw: str, what: str) -> Any:
    try:
        return UUID(raw)
    except ValueError:
        raise typer.BadParameter(f"{what} must be a UUID, got {raw!r}") from None


def _check_account(ledger: Ledger, account_id: Any) -> None:
    """`AccountNotFound` for an id no account has: a typo that finds nothing must not
    read as "nothing to do" (exit 1, as `keys create` and `keys revoke` do)."""
    if account_id is not None and ledger.get_account(account_id) is None:
        raise AccountNotFound(f"account {account_id} does not exist")


def _settings_epilog() -> str:
    from sinal.config import describe

    lines = ["Settings (environment):"]
    lines += [f"{name} ({f'default {default}' if default else 'unset'}): {doc}"
              for name, default, doc in describe()]  # fmt: skip
    return "\n\n".join(lines)


@app.command(epilog=_settings_epilog())
def serve(
    *,
    host: Annotated[
        str | None,
        typer.Option(metavar="ADDRESS", help="Address (default: SINAL_HOST, or 127.0.0.1)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(metavar="PORT", help="Port (default: SINAL_PORT, or 8000).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(metavar="N", help="Server processes (default: SINAL_WORKERS, or 1)."),
    ] = None,
    migrate_first: Annotated[
        bool, typer.Option("--migrate/--no-migrate", help="Apply pending migrations first.")
    ] = True,
    demo_key: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="On a database with no account, create a demo account and print its key "
            "and a curl line to try.",
        ),
    ] = False,
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = False,
    database_url: DatabaseOption = None,
) -> None:
    """Run the HTTP service (FastAPI on uvicorn). /docs shows the API."""
    from sinal.config import env_name

    settings = Settings.from_env().with_overrides(
        database_url=database_url, host=host, port=port, workers=workers
    )
    # named as the user gave them: an option, or the environment
    _check_host(settings.host, "--host " if host is not None else "SINAL_HOST=")
    _check_port(settings.host, settings.port, "--port " if port is not None else "SINAL_PORT=")
    keyring = settings.keyring()
    with connect(settings.database_url, wait=settings.database_wait, keyring=keyring) as ledger:
        if migrate_first:
            ledger.migrate()
        _warn_of_unsealed_secrets(ledger, keyring, may_count=migrate_first)
        if demo_key:
            _print_demo(ledger, settings)
    # The app is built by each worker from the environment: pass the settings on.
    for name in ("database_url", "host", "port", "workers"):
        os.environ[env_name(name)] = str(getattr(settings, name))
    metrics_dir = None
    if settings.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # Workers share their counters through files, so /metrics adds them all up.
        metrics_dir = tempfile.mkdtemp(prefix="sinal-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        _run_uvicorn(settings, access_log=access_log)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _warn_of_unsealed_secrets(ledger: Ledger, keyring: Keyring | None, *, may_count: bool) -> None:
    """A warning when secrets are stored in plaintext (no SINAL_SECRET_KEYS), or, with
    `may_count` (the database is up and migrated), when some are not sealed with the
    current key."""
    if keyring is None:
        _print_warning(
            "SINAL_SECRET_KEYS is not set: secrets (connections' access tokens, app secrets "
            "and API keys, webhook steps' signing secrets) are stored in plaintext "
            "(README: Secrets at rest)"
        )
        return
    if not may_count:
        return
    from sinal.store.automations import AutomationStore

    try:
        counts = cast(AutomationStore, ledger.store).count_secrets()
    except StoreError:  # a warning is not worth failing the start for
        return
    stale = sum(n for kid, n in counts.items() if kid != keyring.current_id)
    if stale:
        _print_warning(
            f"{stale} stored secret(s) not sealed with the current key {keyring.current_id!r} "
            "(plaintext, or a previous key): run `sinal secrets rotate`"
        )


def _check_host(host: str, named: str = "SINAL_HOST=") -> None:
    """`ConfigurationError` naming the setting (`named`: "SINAL_HOST=" or "--host ") if
    `host` is no address of this machine (a name that does not resolve, another machine's
    address): uvicorn and the metrics server say only "Name or service not known", and only
    after the database was opened."""
    try:
        addresses = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:  # socket.gaierror
        raise ConfigurationError(
            f"{named}{host!r} is not an address of this machine: {exc.strerror}"
        ) from None
    # As the server does, one address that binds is enough (::1 of "localhost" may not, with
    # IPv6 off); each is tried on a free port: the port is not the question here.
    reason = "no address"
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(address)
            return
        except OSError as exc:
            reason = exc.strerror or str(exc)
    raise ConfigurationError(f"{named}{host!r} is not an address of this machine: {reason}")


def _check_port(host: str, port: int, named: str) -> None:
    """`ConfigurationError` naming the setting (`named`: "SINAL_PORT=" or "--port ") when
    `port` is taken: uvicorn said so only once the app had started (migrated, its worker
    running), and exited with status 3. Bound as uvicorn binds it (SO_REUSEADDR: a closed
    connection's TIME_WAIT does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            hint = ""
            if exc.errno == errno.EADDRINUSE:  # what to do: `make run` beside a running server
                hint = " (another process listens there: stop it, or give a free port with "
                hint += "--port or SINAL_PORT)"
            raise ConfigurationError(
                f"{named}{port}: cannot listen on {host}:{port}: {exc.strerror}{hint}"
            ) from None


def _run_uvicorn(settings: Settings, *, access_log: bool) -> None:
    import uvicorn

    uvicorn.run(
        "sinal.api.app:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_config=_log_config(settings.log_level),
        log_level=settings.log_level,
        access_log=access_log,
        loop="auto",
        http="auto",
    )


def _this_command() -> str:
    """How to run sinal again as it was run, for a line to paste: `make run` starts
    `.venv/bin/sinal`, which is not on the PATH (`sinal …` was "command not found")."""
    argv0 = sys.argv[0]
    return shlex.quote(argv0) if os.path.basename(argv0) == "sinal" else "sinal"


def _log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging, and sinal's loggers through its handler at `level`: without them
    the worker inside `sinal serve` logged nothing at info (started, abandoned checkouts
    recorded, rows pruned) and its warnings came without their level."""
    from uvicorn.config import LOG_LEVELS, LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["sinal"] = {
        "handlers": ["default"], "level": LOG_LEVELS[level.lower()], "propagate": False,
    }  # fmt: skip
    # other libraries' warnings (psycopg's pool) as uvicorn's lines, not bare on stderr
    config["root"] = {"handlers": ["default"], "level": "WARNING"}
    # `--access-log`: no secret of a query string in the request lines
    config.setdefault("filters", {})["secrets"] = {"()": "sinal.logs.RedactedQuery"}
    config["handlers"]["access"]["filters"] = ["secrets"]
    return config


def _log_worker(level: str) -> None:
    """`sinal worker`'s logging: sinal's lines at `level` (SINAL_LOG_LEVEL), each with its
    time, level and logger; other libraries' (psycopg's pool, httpx) from WARNING only, as
    `sinal serve` has them. The lines had no level (a warning read as any other line), and
    the libraries' INFO came too."""
    import logging

    # SINAL_LOG_LEVEL takes uvicorn's levels: its TRACE (5, below DEBUG) is not logging's
    logging.addLevelName(TRACE_LOG_LEVEL, "TRACE")
    logging.basicConfig(level=logging.WARNING, format=WORKER_LOG_FORMAT)
    logging.getLogger("sinal").setLevel(level.upper())


def _print_demo(ledger: Ledger, settings: Settings) -> None:
    """The demo account's key and a curl line that works as printed (`make run`)."""
    host = f"[{settings.host}]" if ":" in settings.host else settings.host  # IPv6: [::1]
    base = f"http://{host}:{settings.port}"
    existing = ledger.list_accounts(limit=1)
    if existing:  # the scopes of the demo key: the README's next steps need admin
        typer.echo(
            f"The database already has accounts; make a key with:\n  {_this_command()} keys "
            f"create --account {existing[0].id} --scopes ingest,read,admin"
        )
        return
    account = ledger.create_account("Loja Demo")
    text, _ = ledger.create_api_key(account.id, ("ingest", "read", "admin"), "demo")
    body = json.dumps(
        {"metric": "Order Paid", "contact": {"phone": "+55 11 98765-4321", "name": "Ana"},
         "value": "297.90", "source": "shopify", "source_id": "1001", "entity_type": "order",
         "properties": {"order_id": "1001", "total": "297.90"}},
        ensure_ascii=False,
    )  # fmt: skip
    curl = (
        f"curl -sS -X POST {base}/v1/events -H {shlex.quote('Authorization: Bearer ' + text)} "
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )
    typer.echo(f"Demo account {account.name!r} ({account.id}); its API key (shown once):")
    typer.echo(f"  {text}")
    typer.echo("Record an event:")
    typer.echo(f"  {curl}")
    typer.echo(f"Read it back:\n  curl -sS {base}/v1/events -H "
               f"{shlex.quote('Authorization: Bearer ' + text)}")  # fmt: skip
    typer.echo(f"API docs: {base}/docs")


@app.command(
    epilog=_settings_epilog(), short_help="Run an automation worker (outbox, steps, housekeeping)."
)
def worker(database_url: DatabaseOption = None) -> None:
    """Run an automation worker: fans out the outbox, runs executions and, every
    SINAL_HOUSEKEEPING_INTERVAL seconds, its periodic tasks (abandoned checkouts, data
    retention). Run as many as you like on PostgreSQL; one on SQLite. Stops cleanly on
    SIGTERM / Ctrl-C.
    With SINAL_WORKER_METRICS_PORT set, serves Prometheus metrics there."""
    from sinal.worker import run_worker

    settings = Settings.from_env().with_overrides(database_url=database_url)
    if settings.worker_metrics_port:  # its metrics are served at SINAL_HOST
        _check_host(settings.host)
    _log_worker(settings.log_level)
    keyring = settings.keyring()
    with connect(settings.database_url, wait=settings.database_wait, create=False,
                 keyring=keyring) as ledger:  # fmt: skip
        try:
            ledger.check_schema()  # SchemaOutOfDate: "run `sinal migrate`", exit 1
        except SchemaOutOfDate:
            raise
        except StoreError:  # not reachable yet: the worker's loop waits for the database
            pass
        run_worker(ledger, settings)


executions_app = _Typer(help="Automation executions.", no_args_is_help=True)
app.add_typer(executions_app, name="executions")


@executions_app.command("retry", short_help="Revive dead executions, or one named execution.")
def executions_retry(
    execution: Annotated[
        str | None,
        typer.Argument(
            metavar="EXECUTION_ID",
            help="One execution (dead or unknown) to run again; default: every dead one.",
        ),
    ] = None,
    account: Annotated[
        str | None, typer.Option(metavar="ID", help="Only this account's executions.")
    ] = None,
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Revive dead executions (or one named execution, also when its outcome is unknown:
    check with the provider first that the message did not go out)."""
    from sinal.store.automations import AutomationStore

    account_id = None if account is None else _parse_id(account, "--account")
    execution_id = None if execution is None else _parse_id(execution, "EXECUTION")
    with open_ledger(database_url) as ledger:
        _check_account(ledger, account_id)
        store: AutomationStore = ledger.store  # type: ignore[assignment]
        revived = store.retry_dead(account_id, execution_id)
    if execution_id is not None and not revived:
        where = "" if account_id is None else f" in account {account_id}"
        _print_error(f"no dead or unknown execution {execution_id}{where}")
        raise typer.Exit(1)
    if as_json:
        _echo_json({"revived": revived})
    else:
        console.print(f"revived {revived} execution(s)")


webhooks_app = _Typer(help="Webhook deliveries kept raw.", no_args_is_help=True)
app.add_typer(webhooks_app, name="webhooks")
_REPLAYABLE = ("unmappable", "failed", "received")


@webhooks_app.command("replay", short_help="Process kept deliveries again, oldest first.")
def webhooks_replay(
    status: Annotated[
        str,
        typer.Option(
            metavar="STATES",
            help="Comma-separated states to process again: unmappable, failed, received "
            "(kept but never finished, e.g. the process died).",
        ),
    ] = ",".join(_REPLAYABLE),
    account: Annotated[
        str | None, typer.Option(metavar="ID", help="Only this account's deliveries.")
    ] = None,
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Process kept deliveries again (after a mapping fix, or once a missing order came);
    a delivery processed before records duplicates, never second events."""
    from sinal.store.webhooks import DeliveryStatus
    from sinal.webhooks import replay

    wanted = tuple(s.strip() for s in status.split(",") if s.strip())
    unknown = [s for s in wanted if s not in _REPLAYABLE]
    if unknown or not wanted:
        raise typer.BadParameter(f"--status takes {', '.join(_REPLAYABLE)}; got {status!r}")
    account_id = None if account is None else _parse_id(account, "--account")
    with open_ledger(database_url) as ledger:
        _check_account(ledger, account_id)  # before the progress bar, which ends in a newline
        with _progress() as progress:
            task = progress.add_task("replaying deliveries", total=None)

            def advance(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            states = cast("tuple[DeliveryStatus, ...]", wanted)
            outcome = replay(ledger, states, account_id, advance)
    if as_json:
        _echo_json({"replayed": sum(outcome.values()), "outcome": outcome})
        return
    summary = ", ".join(f"{n} {state}" for state, n in sorted(outcome.items())) or "nothing to do"
    console.print(f"replayed {sum(outcome.values())} deliveries: {summary}")


@app.command(short_help="Delete now the finished rows past their SINAL_*_RETENTION_DAYS.")
def prune(as_json: JsonOption = False, database_url: DatabaseOption = None) -> None:
    """Delete now, until none is left, the finished rows older than their
    SINAL_*_RETENTION_DAYS (0, the default: kept for ever), in short transactions beside
    the writers: what the workers' housekeeping does a few thousand rows at a time."""
    from sinal.retention import prune as prune_rows

    retention = Settings.from_env().retention()
    with open_ledger(database_url) as ledger, _progress() as progress:
        bars: dict[str, Any] = {}

        def advance(kind: str, done: int) -> None:
            if kind not in bars:
                bars[kind] = progress.add_task(f"pruning {kind}", total=None)
            progress.update(bars[kind], completed=done)

        pruned = prune_rows(ledger, retention, max_rounds=None, progress=advance)
    if as_json:
        _echo_json({"pruned": pruned})
        return
    if not pruned:
        console.print("nothing to prune: every SINAL_*_RETENTION_DAYS is 0 (kept for ever)")
    for kind, n in pruned.items():
        console.print(f"pruned {n} {kind} older than {getattr(retention, kind)} days")


secrets_app = _Typer(
    help="Stored secrets, sealed with SINAL_SECRET_KEYS (README: Secrets at rest).",
    no_args_is_help=True,
)
app.add_typer(secrets_app, name="secrets")


@secrets_app.command("status")
def secrets_status(as_json: JsonOption = False, database_url: DatabaseOption = None) -> None:
    """Count the stored secrets per key that sealed them, and those in plaintext."""
    from sinal.rotation import secret_status

    with open_ledger(database_url) as ledger:
        status = secret_status(ledger)
    if as_json:
        _echo_json(status.as_dict())
        return
    current = "none (SINAL_SECRET_KEYS is not set)" if status.current is None else status.current
    console.print(f"current key: {current}")
    for kid, n in sorted(status.counts.items()):
        console.print(f"  {kid}: {n} secret(s)")
    if status.stale and status.current is not None:
        console.print(f"{status.stale} of {status.total} to rotate: run `sinal secrets rotate`")
    else:
        console.print(f"{status.total} secret(s) stored")


@secrets_app.command(
    "rotate", short_help="Seal every stored secret with the current key of SINAL_SECRET_KEYS."
)
def secrets_rotate(as_json: JsonOption = False, database_url: DatabaseOption = None) -> None:
    """Seal again with the current key (the first of SINAL_SECRET_KEYS) every stored secret
    in plaintext or sealed with a previous key, 100 rows per transaction; running
    it again finishes an interrupted rotation. Once it has run, drop the previous keys."""
    from sinal.rotation import check_rotation, rotate_secrets, secret_status

    with open_ledger(database_url) as ledger:
        before = check_rotation(ledger)  # before the progress bar, which ends in a newline
        with _progress() as progress:
            task = progress.add_task("sealing secrets", total=before.total)
            resealed = rotate_secrets(ledger, lambda read: progress.update(task, completed=read))
        after = secret_status(ledger)
    if as_json:
        _echo_json({"resealed": resealed, **after.as_dict()})
    else:
        console.print(f"sealed {resealed} secret(s) with key {after.current}; "
                      f"{after.total} stored, {after.stale} not sealed with it")  # fmt: skip


@secrets_app.command("new-key")
def secrets_new_key(
    key_id: Annotated[str, typer.Argument(metavar="KEY_ID", help="The new key's id, e.g. k2.")],
) -> None:
    """Print a fresh key, ID:BASE64, to put first in SINAL_SECRET_KEYS (it uses no database)."""
    from sinal.keyring import new_key

    typer.echo(new_key(key_id))


@app.command()
def version() -> None:
    """Print sinal's version."""
    from sinal import __version__

    console.print(__version__)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,  # in a log or a pipe it left an empty line
    )


def main() -> None:
    """Entry point: run the app, turning sinal's errors into one readable line."""
    try:
        app()
    except SinalError as exc:
        _print_error(str(exc))
        raise SystemExit(1) from exc


def _print_warning(message: str) -> None:
    """`warning: message` on stderr, on one line."""
    err_console.print(Text.assemble(("warning:", "yellow"), " ", message), soft_wrap=True)


def _print_error(message: str) -> None:
    """`error: message` on stderr, the message as it is (never read as markup)."""
    # soft_wrap: one line however narrow the terminal (or log) is, for grep and for CI
    err_console.print(Text.assemble(("error:", "red"), " ", message), soft_wrap=True)
