"""`poirotd memory`: what ErrorProbe's verified memory holds, and deleting what should not be
there. Works on the daemon's database directly (also while it runs: SQLite serialises the
writes, and every change is chained into the audit log like the daemon's own)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from poirotd.model import DiagnosisMemoryEntry
    from poirotd.store import SqliteStore

app = typer.Typer(
    no_args_is_help=True,
    help="List or delete the failure patterns ErrorProbe learnt from verified diagnoses.",
)

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar="POIROTD_DB_PATH", help="the daemon's SQLite database"),
]
SystemOption = Annotated[str, typer.Option(help="the system (spec system.name) the memory is of")]


@app.command("list")
def list_command(
    db: DbOption,
    system: SystemOption,
    deleted: Annotated[bool, typer.Option("--deleted", help="include deleted entries")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
) -> None:
    """The entries, most recently verified first."""
    from rich.console import Console
    from rich.table import Table

    entries = asyncio.run(_entries(_existing(db), system, deleted))
    if as_json:
        for entry in entries:
            typer.echo(entry.model_dump_json())
        return
    table = Table("pattern", "verified", "confirmed / refuted", "retrieved", "recipe")
    table.add_column("entry", no_wrap=True)
    for e in entries:
        tool = f" / {e.signature.tool}" if e.signature.tool else ""
        table.add_row(
            f"{e.signature.mode} {e.signature.agent}{tool}",
            f"{e.verified_by} x{e.frequency}, {e.last_verified_at:%Y-%m-%d}",
            f"{e.confirmed} / {e.refuted}",
            str(e.retrieved),
            e.recipe,
            e.entry_id + (" (deleted)" if e.deleted_at else ""),
        )
    Console().print(table)


@app.command("delete")
def delete_command(
    entry_id: Annotated[str, typer.Argument(help="the entry to delete (from `memory list`)")],
    db: DbOption,
    system: SystemOption,
) -> None:
    """Delete an entry: it is never offered to a diagnosis again (its history stays in the
    audit log). A later verified diagnosis of the same pattern starts it afresh."""
    entry = asyncio.run(_delete(_existing(db), system, entry_id))
    if entry is None:
        typer.echo(f"no memory entry {entry_id!r} for system {system!r} in {db}", err=True)
        raise typer.Exit(1)
    typer.echo(f"deleted {entry.entry_id} ({entry.signature.mode}, {entry.signature.agent})")


async def _entries(db: Path, system: str, deleted: bool) -> list[DiagnosisMemoryEntry]:
    store = await _open(db)
    try:
        return await store.memory_entries(system, include_deleted=deleted)
    finally:
        await store.close()


async def _delete(db: Path, system: str, entry_id: str) -> DiagnosisMemoryEntry | None:
    store = await _open(db)
    try:
        return await store.delete_memory_entry(system, entry_id, datetime.now(UTC))
    finally:
        await store.close()


async def _open(db: Path) -> SqliteStore:
    from poirotd.store import SqliteStore

    return await SqliteStore.open(db)


def _existing(db: Path) -> Path:
    """The database must exist: opening a missing one would create an empty store."""
    if not db.is_file():
        typer.echo(f"{db}: no such database file", err=True)
        raise typer.Exit(2)
    return db
