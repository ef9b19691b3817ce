"""The `poirotd` command line."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from poirotd.cli.audit import app as audit_app
from poirotd.cli.connection import Connection, JsonOption, connects, print_json
from poirotd.cli.investigations import app as investigations_app
from poirotd.cli.memory import app as memory_app
from poirotd.cli.sessions import app as sessions_app
from poirotd.cli.token import app as token_app
from poirotd.config import Settings
from poirotd.config.loader import SpecError

if TYPE_CHECKING:
    from poirotd.api.poirot.v1 import poirot_pb2 as pb

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="poirotd: POIROT incident attribution beside an LLM multi-agent system.",
)
app.add_typer(audit_app, name="audit")
app.add_typer(investigations_app, name="investigations")
app.add_typer(memory_app, name="memory")
app.add_typer(sessions_app, name="sessions")
app.add_typer(token_app, name="token")

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
    from poirotd.daemon import Daemon, load_system_spec
    from poirotd.errors import StartupError
    from poirotd.observability import logs

    settings = _settings(grpc_port=grpc_port, metrics_port=metrics_port, db_path=db)
    logs.configure(settings.log_level, settings.log_format)
    try:
        spec = load_system_spec(config)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    try:
        asyncio.run(Daemon(settings, spec).run_until_signalled(ready_file))
    except StartupError as exc:  # what had started is stopped again: the message says why
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


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


# The evaluation harness is the optional package poirot_eval (the `eval` extra). Its commands are
# found through the entry-point group `poirotd.commands` (pyproject.toml) when one of them runs,
# so the daemon's CLI imports nothing of it; every argument, --help included, goes to the
# harness's own command unchanged.
_COMMANDS_GROUP = "poirotd.commands"
_PASSED_ON = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("eval", context_settings=_PASSED_ON, add_help_option=False)
def eval_(ctx: typer.Context) -> None:
    """Run benchmark cases (BLAME, Who&When, TracerTraj) through the daemon and score them."""
    _run_evaluation_command("eval", ctx)


@app.command(context_settings=_PASSED_ON, add_help_option=False)
def replay(ctx: typer.Context) -> None:
    """Feed a benchmark case into a running daemon over gRPC, paced like the session."""
    _run_evaluation_command("replay", ctx)


@app.command(context_settings=_PASSED_ON, add_help_option=False)
def campaign(ctx: typer.Context) -> None:
    """Inject faults into clean sessions and write the validated variants as labelled cases."""
    _run_evaluation_command("campaign", ctx)


def _run_evaluation_command(name: str, ctx: typer.Context) -> None:
    """Runs poirot_eval's command `name` on the arguments given, or exits 2 saying how to install
    the extra it comes with."""
    found = entry_points(group=_COMMANDS_GROUP, name=name)
    if not found:
        typer.echo(
            f"poirotd {name}: no command registered under {_COMMANDS_GROUP!r} "
            "(reinstall poirotd: pip install 'poirotd[eval]')",
            err=True,
        )
        raise typer.Exit(2)
    try:
        harness_command = next(iter(found)).load()
    except ModuleNotFoundError as exc:
        typer.echo(
            f"poirotd {name} needs the eval extra (no module {exc.name!r}): "
            "pip install 'poirotd[eval]'",
            err=True,
        )
        raise typer.Exit(2) from None
    command = typer.main.get_command(harness_command)
    command.main(ctx.args, prog_name=ctx.command_path, standalone_mode=True)


@app.command()
@connects
def confirm(
    daemon: Connection,
    investigation_id: Annotated[str, typer.Argument(help="a succeeded investigation")],
    regions: Annotated[
        list[str], typer.Argument(help="id(s) of the hazard region(s) that truly caused it")
    ],
    note: Annotated[str, typer.Option(help="who confirmed it, and how")] = "",
    supersede: Annotated[
        bool,
        typer.Option(help="correct an outcome confirmed before with other regions (needs --note)"),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Report the true cause of an investigated incident (ConfirmOutcome).

    The record keeps it; with reputation enabled in the spec, every agent's β is derived anew
    from all confirmed outcomes. Confirming the same regions again changes nothing; other
    regions are refused unless --supersede (a correction: the replaced outcome is kept).
    """
    response = daemon.call(
        lambda client: client.confirm(investigation_id, regions, note, supersede=supersede)
    )
    if as_json:
        print_json(response)
        return
    status = "confirmed" if response.newly_confirmed else "already confirmed, unchanged"
    if response.HasField("superseded"):
        status = f"confirmed, superseding {', '.join(response.superseded.region_ids)}"
    typer.echo(f"{investigation_id}: {', '.join(response.confirmed.region_ids)} ({status})")
    _print_betas(response.betas)


reputation_app = typer.Typer(
    help="The β each agent's vote is weighed with, and seeding it from a fault campaign."
)
app.add_typer(reputation_app, name="reputation")


@reputation_app.callback(invoke_without_command=True)
@connects
def reputation(ctx: typer.Context, daemon: Connection, as_json: JsonOption = False) -> None:
    """Show the β each agent's vote is weighed with now (GetReputation); `seed` sets a fault
    campaign's values beside the confirmed ones."""
    if ctx.invoked_subcommand is not None:
        return
    response = daemon.call(lambda client: client.reputation())
    if as_json:
        print_json(response)
        return
    if not response.reputation_enabled:
        typer.echo("reputation is off in the spec: every vote is weighed with the spec's β")
    _print_betas(response.betas)


@reputation_app.command("seed")
@connects
def seed_reputation(
    daemon: Connection,
    results: Annotated[
        Path,
        typer.Option("--from", help="results.jsonl of `poirotd eval` over labelled cases"),
    ],
    source: Annotated[str, typer.Option(help="what to call the campaign (default: the file)")] = "",
    as_json: JsonOption = False,
) -> None:
    """Seed the agents' β and the ensemble's reliabilities from a fault campaign (SeedReputation).

    Kept apart from confirmed outcomes and shown beside them, weighed in only as the spec's
    campaign_weight says; a new seed replaces the one before.
    """
    from poirotd.api.limits import SEED_REQUEST_BYTES
    from poirotd.api.poirot.v1 import poirot_pb2 as pb
    from poirotd.cli.seeding import ResultsError, campaign_outcomes

    try:
        outcomes = campaign_outcomes(results)
    except ResultsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    request = pb.SeedReputationRequest(source=source or results.name, outcomes=outcomes)
    if request.ByteSize() > SEED_REQUEST_BYTES:
        typer.echo(
            f"{results}: {len(outcomes)} outcomes take {request.ByteSize():,} bytes, more than "
            f"the daemon takes in one seed ({SEED_REQUEST_BYTES:,}); seed from fewer cases",
            err=True,
        )
        raise typer.Exit(2)
    response = daemon.call(lambda client: client.seed_reputation(request.source, outcomes))
    if as_json:
        print_json(response)
        return
    typer.echo(
        f"seeded from {response.campaign_source}: {response.campaign_cases} outcomes, "
        f"campaign weight {response.campaign_weight:g}"
        + (" (the campaign's β is shown, not used)" if response.campaign_weight == 0 else "")
    )
    _print_betas(response.betas)


def _print_betas(betas: Iterable[pb.AgentBeta]) -> None:
    """The β in use; with a campaign seed, also the confirmed and the campaign's β."""
    from rich.console import Console
    from rich.table import Table

    betas = list(betas)
    seeded = any(beta.HasField("campaign") for beta in betas)
    table = Table("agent", "β", "confirmations", "last confirmed investigation")
    if seeded:
        table.add_column("confirmed β")
        table.add_column("campaign β (cases)")
    for beta in betas:
        row = [beta.agent_id, f"{beta.beta:.3f}", str(beta.confirmations), beta.investigation_id]
        if seeded:
            campaign = beta.campaign
            shown = f"{campaign.value:.3f} ({campaign.cases})" if beta.HasField("campaign") else ""
            row += [f"{beta.confirmed_beta:.3f}", shown]
        table.add_row(*row)
    Console().print(table)
