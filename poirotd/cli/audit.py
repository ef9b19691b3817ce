"""`poirotd audit`: check the tamper-evident record, export an investigation for an auditor,
review the ingest conflicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    no_args_is_help=True,
    help="Check the audit chain; export an investigation as a re-verifiable JSON report; review"
    " ingest conflicts.",
)

DbOption = Annotated[
    Path | None,
    typer.Option("--db", envvar="POIROTD_DB_PATH", help="the daemon's SQLite database (read only)"),
]
DbUrlOption = Annotated[
    str | None,
    typer.Option(
        "--db-url",
        envvar="POIROTD_DB_URL",
        help="the daemons' PostgreSQL database, postgresql://... (read only); libpq's PGPASSFILE"
        " and ~/.pgpass apply",
    ),
]
PasswordFileOption = Annotated[
    Path | None,
    typer.Option(
        "--db-password-file",
        envvar="POIROTD_DB_PASSWORD_FILE",
        help="a file holding the PostgreSQL password (instead of one in the URL)",
    ),
]


def _database(
    db: Path | None, db_url: str | None, password_file: Path | None
) -> tuple[Path | str, str | None]:
    """The database to audit (a file, or a checked URL) and its password; ValueError or
    OSError saying what is wrong."""
    from poirotd.store.pg_url import check_url, read_password

    if (db is None) == (db_url is None):
        raise ValueError("give --db (a SQLite file) or --db-url (PostgreSQL), one of them")
    if db_url is None:
        assert db is not None
        return db, None
    return check_url(db_url), read_password(password_file)


@app.command("verify")
def verify_command(
    db: DbOption = None,
    db_url: DbUrlOption = None,
    db_password_file: PasswordFileOption = None,
    anchor: Annotated[
        str | None,
        typer.Option(help="SEQ:HASH noted from an earlier verify or export: must still be there"),
    ] = None,
    checkpoints: Annotated[
        Path | None,
        typer.Option(help="the daemon's checkpoint file: its latest head must still be there"),
    ] = None,
) -> None:
    """Check the chain and every stored record against it.

    Exit 0 with a one-line summary when all is intact, 1 naming the first broken link, 2 when the
    database cannot be audited.
    """
    from poirotd.store.audit import AuditError, ChainHead, latest_checkpoint, verify

    try:
        if anchor and checkpoints:
            raise ValueError("give --anchor or --checkpoints, not both")
        target, password = _database(db, db_url, db_password_file)
        head = latest_checkpoint(checkpoints) if checkpoints else None
        parsed = ChainHead.parse(anchor) if anchor else head
        report = verify(target, anchor=parsed, password=password)
    except (AuditError, ValueError, OSError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    typer.echo(report.summary(), err=not report.ok)
    raise typer.Exit(0 if report.ok else 1)


@app.command("export")
def export_command(
    investigation_id: Annotated[str, typer.Argument(help="the investigation to export")],
    db: DbOption = None,
    db_url: DbUrlOption = None,
    db_password_file: PasswordFileOption = None,
    out: Annotated[Path | None, typer.Option(help="write here instead of to stdout")] = None,
) -> None:
    """Write one investigation as a self-contained JSON report.

    Everything it saw and produced, each record with its audit hashes, and the chain head.
    """
    from poirotd.store.audit import AuditError, export_investigation

    try:
        target, password = _database(db, db_url, db_password_file)
        report = export_investigation(target, investigation_id, password=password)
    except (AuditError, ValueError, OSError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    text = json.dumps(report, ensure_ascii=False, indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")


@app.command("conflicts")
def conflicts_command(
    db: DbOption = None,
    db_url: DbUrlOption = None,
    db_password_file: PasswordFileOption = None,
    session: Annotated[str | None, typer.Option(help="only this session's conflicts")] = None,
    limit: Annotated[int, typer.Option(min=1, help="the newest this many")] = 100,
) -> None:
    """List the items ingest set aside as conflicts, each beside the stored item it met.

    A conflict is an item whose producer key, or session and index, an item of other content
    held: `set_aside` is the item as it came, `stored` the one the session holds (null when the
    session does not hold it). JSON, newest first.
    """
    from poirotd.store.audit import AuditError, review_conflicts

    try:
        target, password = _database(db, db_url, db_password_file)
        found = review_conflicts(target, session_id=session, limit=limit, password=password)
    except (AuditError, ValueError, OSError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(found, ensure_ascii=False, indent=2))
