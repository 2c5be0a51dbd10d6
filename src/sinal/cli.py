"""The commands a person types: `sinal migrate`, `sinal demo`, `sinal rebuild-summaries`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sinal.config import Settings
from sinal.errors import SinalError
from sinal.ledger import Ledger, connect

app = typer.Typer(
    name="sinal",
    help="sinal: the event system of a commerce + WhatsApp CRM platform.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="SINAL_DATABASE_URL",
        help="sqlite:///file.db or postgresql://user@host:port/db [default: sqlite:///sinal.db]",
        show_default=False,
    ),
]


def open_ledger(database_url: str | None) -> Ledger:
    """The ledger for a command: --database-url, else SINAL_DATABASE_URL, else the default."""
    return connect(database_url or Settings.from_env().database_url)


@app.command()
def migrate(database_url: DatabaseOption = None) -> None:
    """Apply pending schema migrations (idempotent) and print the schema version."""
    with open_ledger(database_url) as ledger:
        applied = ledger.migrate()
        version = ledger.schema_version()
    if applied:
        console.print(
            f"applied migrations {', '.join(map(str, applied))}; schema version {version}"
        )
    else:
        console.print(f"schema is up to date (version {version})")


@app.command("rebuild-summaries")
def rebuild_summaries(
    database_url: DatabaseOption = None,
    account: Annotated[
        str | None, typer.Option(help="Only this account's summaries (default: all).")
    ] = None,
) -> None:
    """Recompute contact_metrics_summary from the events table and report the drift fixed."""
    with open_ledger(database_url) as ledger, _progress() as progress:
        task = progress.add_task("rebuilding summaries", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        reports = ledger.rebuild_summaries(account, advance)
    drift = sum(r.drift for r in reports)
    for report in reports:
        for line in report.details:
            console.print(f"  account {report.account_id}: {line}")
    console.print(
        f"{len(reports)} account(s), {sum(r.rows for r in reports)} summary rows; "
        f"fixed {drift} drifted row(s)"
        + (
            f" ({sum(r.inserted for r in reports)} missing, "
            f"{sum(r.changed for r in reports)} wrong, {sum(r.deleted for r in reports)} orphaned)"
            if drift
            else ""
        )
    )


@app.command()
def demo(database_url: DatabaseOption = None) -> None:
    """Create an account and contacts, emit a realistic sequence, and show what was stored."""
    from sinal.demo import run_demo

    with open_ledger(database_url) as ledger:
        ledger.migrate()
        run_demo(ledger, console)


@app.command()
def version() -> None:
    """Print sinal's version."""
    from sinal import __version__

    console.print(__version__)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )


def main() -> None:
    """Entry point: run the app, turning sinal's errors into one readable line."""
    try:
        app()
    except SinalError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise SystemExit(1) from exc
