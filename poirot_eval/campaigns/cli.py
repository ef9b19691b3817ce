"""`poirotd campaign run`: faults injected into clean sessions, validated, written as cases."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from poirot_eval.llm_options import (
    BaseUrlOption,
    ContextTokensOption,
    ModelOption,
    ModelPathOption,
    StructuredOutputOption,
    ThreadsOption,
    llm_spec,
)

if TYPE_CHECKING:
    # Imported where used: `poirotd eval ...` and `replay` load this module too.
    from poirot_eval.campaigns.generate import CampaignOutcome
    from poirot_eval.campaigns.plan import CampaignPlan
    from poirot_eval.cases import EvalCase
    from poirotd.config import LLMSpec

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Inject faults into clean sessions (eval cases or the daemon's store) and write the "
    "variants whose hazard fires as labelled one-case JSON files.",
)


@app.callback()
def campaign() -> None:
    """A group, so that `poirotd campaign run` keeps its subcommand name."""


VARIANTS = "variants"


def manifest_path(out: Path, plan: CampaignPlan) -> Path:
    """Per plan, so several plans (one per system) can write their variants to one folder."""
    return out / f"campaign-{plan.name}.json"


@app.command("run")
def run_command(
    plan_file: Annotated[Path, typer.Argument(help="the campaign plan (YAML, docs/campaigns.md)")],
    out: Annotated[
        Path,
        typer.Option(
            help="folder: variants/<case>.json and campaign-<plan name>.json (the counts); "
            "several plans may share it"
        ),
    ],
    case: Annotated[
        list[str] | None,
        typer.Option(
            help="a source: DATASET:CASE_ID or a one-case JSON file; repeat for more",
        ),
    ] = None,
    store: Annotated[
        bool,
        typer.Option(
            help="take the sources from the daemon's store (POIROTD_DB_PATH or POIROTD_DB_URL), "
            "sessions of the --config system",
        ),
    ] = False,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="--store: the system spec (YAML)")
    ] = None,
    since: Annotated[
        datetime | None, typer.Option(help="--store: sessions started at or after (UTC)")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option(help="--store: sessions started before (UTC)")
    ] = None,
    with_incidents: Annotated[
        bool,
        typer.Option(help="--store: also sessions that had an investigation (default: clean)"),
    ] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="--store: at most this many")] = None,
    data_dir: Annotated[
        Path,
        typer.Option(envvar="POIROTD_EVAL_DATA", help="the data folder, for DATASET:CASE_ID"),
    ] = Path("data"),
    model_path: ModelPathOption = None,
    context_tokens: ContextTokensOption = None,
    threads: ThreadsOption = None,
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    structured_output: StructuredOutputOption = "json_schema",
) -> None:
    """Apply every fault of PLAN_FILE to every source session; keep the variants whose hazard
    fires (and not on the source), count the others by reason. The LLM (embedded by default)
    is loaded only when the plan has LLM faults or follow_up: reenact."""
    from poirot_eval.campaigns.plan import read_plan
    from poirot_eval.case_files import CaseFileError

    try:
        plan = read_plan(plan_file)
    except CaseFileError as exc:
        typer.echo(f"cannot read the plan: {exc}", err=True)
        raise typer.Exit(2) from exc
    if bool(case) == store:
        typer.echo("name the sources: --case (one or more) or --store, not both", err=True)
        raise typer.Exit(2)
    sources = _sources(case or [], data_dir, store, config, since, until, with_incidents, limit)
    if not sources:
        typer.echo("no source sessions matched", err=True)
        raise typer.Exit(2)
    needs_llm = plan.follow_up == "reenact" or any(getattr(f, "is_llm", False) for f in plan.faults)
    llm = (
        llm_spec(model_path, context_tokens, threads, base_url, model, structured_output)
        if needs_llm
        else None
    )
    outcome = asyncio.run(_run(plan, sources, llm))
    _write(out, plan, sources, outcome, llm.model_dump(mode="json") if llm else None)
    _print(outcome, out, manifest_path(out, plan))


def _sources(
    refs: list[str],
    data_dir: Path,
    store: bool,
    config: Path | None,
    since: datetime | None,
    until: datetime | None,
    with_incidents: bool,
    limit: int | None,
) -> list[EvalCase]:
    from poirot_eval.campaigns import sources

    if not store:
        try:
            return sources.from_refs(refs, data_dir)
        except (OSError, ValueError) as exc:
            typer.echo(f"cannot load a source: {exc}", err=True)
            raise typer.Exit(2) from exc
    if config is None:
        typer.echo(
            "--store needs --config (the spec of the system whose sessions to use)", err=True
        )
        raise typer.Exit(2)
    from poirotd.config.loader import load_spec
    from poirotd.config.settings import Settings
    from poirotd.daemon import open_store

    try:
        spec = load_spec(config)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc

    async def read() -> list[EvalCase]:
        opened = await open_store(Settings())
        try:
            return await sources.from_store(
                opened,
                spec,
                since=_utc(since),
                until=_utc(until),
                with_incidents=with_incidents,
                limit=limit,
            )
        finally:
            await opened.close()

    return asyncio.run(read())


def _utc(at: datetime | None) -> datetime | None:
    from datetime import UTC

    return at if at is None or at.tzinfo is not None else at.replace(tzinfo=UTC)


async def _run(plan: CampaignPlan, sources: list[EvalCase], llm: LLMSpec | None) -> CampaignOutcome:
    from poirot_eval.campaigns.generate import run_campaign
    from poirotd.llm.factory import open_backend

    if llm is None:
        return await run_campaign(plan, sources, None)
    backend = await open_backend(llm)
    try:
        return await run_campaign(plan, sources, backend)
    finally:
        await backend.aclose()


def _write(
    out: Path,
    plan: CampaignPlan,
    sources: list[EvalCase],
    outcome: CampaignOutcome,
    llm: dict[str, object] | None,
) -> None:
    folder = out / VARIANTS
    folder.mkdir(parents=True, exist_ok=True)
    for variant in outcome.kept:
        (folder / f"{variant.case_id}.json").write_text(variant.model_dump_json(indent=1) + "\n")
    usage = outcome.usage
    manifest = {
        "plan": plan.model_dump(mode="json"),
        "llm": llm,
        "sources": [f"{s.dataset}:{s.case_id}" for s in sources],
        "generated": len(outcome.kept) + len(outcome.dropped),
        "kept": len(outcome.kept),
        "dropped": len(outcome.dropped),
        "dropped_by_reason": outcome.reasons,
        "kept_variants": [v.case_id for v in outcome.kept],
        "dropped_variants": [d.__dict__ for d in outcome.dropped],
        "llm_usage": {
            "calls": usage.calls,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "seconds": round(usage.seconds, 3),
        },
        "seconds": round(outcome.seconds, 3),
    }
    manifest_path(out, plan).write_text(json.dumps(manifest, indent=1) + "\n")


def _print(outcome: CampaignOutcome, out: Path, manifest: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="Variants")
    for column in ("kept", "dropped", *outcome.reasons):
        table.add_column(column)
    table.add_row(
        str(len(outcome.kept)),
        str(len(outcome.dropped)),
        *(str(n) for n in outcome.reasons.values()),
    )
    console.print(table)
    console.print(
        f"variants in {out / VARIANTS} (`poirotd eval run --cases {out / VARIANTS}`); "
        f"counts and every drop's reason in {manifest}"
    )
