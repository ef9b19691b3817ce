"""The `poirotd` command line."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from pydantic import ValidationError

from poirotd.cli.audit import app as audit_app
from poirotd.config import Settings
from poirotd.config.loader import SpecError
from poirotd.eval.cli import CaseArgument, DataDirOption, MethodOption, load_case
from poirotd.eval.cli import app as eval_app

if TYPE_CHECKING:
    import grpc

    from poirotd.api.client import PoirotClient
    from poirotd.api.poirot.v1 import poirot_pb2 as pb

T = TypeVar("T")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="poirotd: POIROT incident attribution beside an LLM multi-agent system.",
)
app.add_typer(audit_app, name="audit")
app.add_typer(eval_app, name="eval")

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="YAML system spec")]
TargetOption = Annotated[str, typer.Option(help="the running daemon's gRPC address (host:port)")]
DEFAULT_TARGET = "127.0.0.1:50051"


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
    from poirotd.daemon import Daemon, load_system_spec
    from poirotd.observability import logs

    settings = _settings(grpc_port=grpc_port, metrics_port=metrics_port, db_path=db)
    logs.configure(settings.log_level, settings.log_format)
    try:
        spec = load_system_spec(config)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    asyncio.run(Daemon(settings, spec).run_until_signalled(ready_file))


@app.command("check-config")
def check_config(path: Annotated[Path, typer.Argument(help="YAML system spec")]) -> None:
    """Validate a system spec; exit non-zero naming each offending field and line."""
    from poirotd.daemon import load_system_spec

    try:
        spec = load_system_spec(path)
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


@app.command()
def replay(
    case: CaseArgument,
    target: TargetOption = DEFAULT_TARGET,
    data_dir: DataDirOption = Path("data"),
    speed: Annotated[
        float, typer.Option(min=0.001, help="replay this many times faster than recorded")
    ] = 1.0,
    interval: Annotated[
        float | None, typer.Option(min=0, help="seconds between messages, ignoring their times")
    ] = None,
    session_id: Annotated[
        str | None, typer.Option(help="session id to use (default: the case's, made unique)")
    ] = None,
    trigger: Annotated[bool, typer.Option(help="trigger an investigation at the end")] = False,
    watch: Annotated[
        bool, typer.Option(help="follow the investigation to its attribution (implies --trigger)")
    ] = False,
    method: MethodOption = "poirot",
) -> None:
    """Feed a benchmark case into a running daemon over gRPC, paced like the session.

    The daemon must serve the case's system: `poirotd eval spec CASE -o spec.yaml`, then
    `poirotd run --config spec.yaml`.
    """
    import uuid

    import grpc
    from rich.console import Console

    from poirotd.eval.replay import replay as replay_case
    from poirotd.eval.session import session_id_of

    loaded = load_case(case, data_dir)
    try:
        investigation = asyncio.run(
            replay_case(
                loaded,
                target,
                session_id=session_id or f"{session_id_of(loaded)}-{uuid.uuid4().hex[:8]}",
                speed=speed,
                interval=interval,
                trigger=trigger or watch,
                watch=watch,
                method=method,
                console=Console(),
            )
        )
    except grpc.aio.AioRpcError as exc:
        raise _refused(target, exc) from exc
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if watch and investigation is not None and investigation.error:
        raise typer.Exit(1)


@app.command()
def confirm(
    investigation_id: Annotated[str, typer.Argument(help="a succeeded investigation")],
    regions: Annotated[
        list[str], typer.Argument(help="id(s) of the hazard region(s) that truly caused it")
    ],
    note: Annotated[str, typer.Option(help="who confirmed it, and how")] = "",
    supersede: Annotated[
        bool,
        typer.Option(help="correct an outcome confirmed before with other regions (needs --note)"),
    ] = False,
    target: TargetOption = DEFAULT_TARGET,
) -> None:
    """Report the true cause of an investigated incident (ConfirmOutcome).

    The record keeps it; with reputation enabled in the spec, every agent's β is derived anew
    from all confirmed outcomes. Confirming the same regions again changes nothing; other
    regions are refused unless --supersede (a correction: the replaced outcome is kept).
    """
    response = _with_client(
        target,
        lambda client: client.confirm(investigation_id, regions, note, supersede=supersede),
    )
    status = "confirmed" if response.newly_confirmed else "already confirmed, unchanged"
    if response.HasField("superseded"):
        status = f"confirmed, superseding {', '.join(response.superseded.region_ids)}"
    typer.echo(f"{investigation_id}: {', '.join(response.confirmed.region_ids)} ({status})")
    _print_betas(response.betas)


@app.command()
def reputation(target: TargetOption = DEFAULT_TARGET) -> None:
    """Show the β each agent's vote is weighed with now (GetReputation)."""
    response = _with_client(target, lambda client: client.reputation())
    if not response.reputation_enabled:
        typer.echo("reputation is off in the spec: every vote is weighed with the spec's β")
    _print_betas(response.betas)


def _with_client(target: str, call: Callable[[PoirotClient], Awaitable[T]]) -> T:
    """One call to the daemon at `target`; a refusal or an unreachable daemon exits 1."""
    import grpc

    from poirotd.api.client import PoirotClient

    async def once() -> T:
        async with PoirotClient(target) as client:
            return await call(client)

    try:
        return asyncio.run(once())
    except grpc.aio.AioRpcError as exc:
        raise _refused(target, exc) from exc


def _refused(target: str, exc: grpc.aio.AioRpcError) -> typer.Exit:
    typer.echo(f"the daemon at {target} refused: {exc.code().name}: {exc.details()}", err=True)
    return typer.Exit(1)


def _print_betas(betas: Iterable[pb.AgentBeta]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("agent", "β", "confirmations", "last confirmed investigation")
    for beta in betas:
        table.add_row(
            beta.agent_id, f"{beta.beta:.3f}", str(beta.confirmations), beta.investigation_id
        )
    Console().print(table)
