"""The `poirotd` command line."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from poirotd.audit_cli import app as audit_app
from poirotd.config import Settings
from poirotd.config.loader import SpecError, load_spec

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="poirotd: POIROT incident attribution beside an LLM multi-agent system.",
)
app.add_typer(audit_app, name="audit")

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="YAML system spec")]


def _settings(**overrides: Any) -> Settings:
    """Environment (POIROTD_*) first, command-line options on top."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"invalid settings: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command()
def run(
    config: ConfigOption,
    grpc_port: Annotated[int | None, typer.Option(help="0 = any free port")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="0 = any free port")] = None,
    db: Annotated[Path | None, typer.Option(help="SQLite database path")] = None,
    ready_file: Annotated[
        Path | None, typer.Option(help="write {pid, grpc_port, metrics_port} here once serving")
    ] = None,
) -> None:
    """Run the daemon until SIGTERM or SIGINT."""
    from poirotd import logs
    from poirotd.daemon import Daemon

    settings = _settings(grpc_port=grpc_port, metrics_port=metrics_port, db_path=db)
    logs.configure(settings.log_level, settings.log_format)
    try:
        spec = load_spec(config)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    asyncio.run(Daemon(settings, spec).run_until_signalled(ready_file))


@app.command("check-config")
def check_config(path: Annotated[Path, typer.Argument(help="YAML system spec")]) -> None:
    """Validate a system spec; exit non-zero naming each offending field and line."""
    try:
        spec = load_spec(path)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    typer.echo(
        f"{path}: ok (system {spec.system.name!r}, {len(spec.agents)} agents, "
        f"{len(spec.components)} other components)"
    )


@app.command()
def demo(
    workdir: Annotated[
        Path | None,
        typer.Option(help="keep the database and log here (default: a temporary folder)"),
    ] = None,
) -> None:
    """Start a daemon on the CORTEX demo system, replay a session, investigate, show the result."""
    from poirotd.demo.main import run_demo

    raise typer.Exit(run_demo(workdir))
