"""`poirotd eval` and `poirotd replay`: run benchmark cases through the daemon, score them, export
a case's spec, feed a case to a running daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from poirot_eval.cases import Benchmark, Dataset, EvalCase
from poirot_eval.llm_options import (
    BaseUrlOption,
    ContextTokensOption,
    ModelOption,
    ModelPathOption,
    StructuredOutputOption,
    ThreadsOption,
    llm_spec,
)
from poirot_eval.poirot_runs import Reaggregation, ZeroPosition
from poirot_eval.whowhen import SUBSETS, Subset
from poirotd.cli.connection import DEFAULT_TARGET, TargetOption, refused
from poirotd.config import OpenAILLMSpec
from poirotd.model import InvestigationMethod

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run benchmark cases (BLAME, Who&When, TracerTraj) through the daemon and score them.",
)
# `poirotd replay`: one command, so a Typer of its own (a group needs a subcommand name).
replay_app = typer.Typer(add_completion=False)

DataDirOption = Annotated[
    Path,
    typer.Option(
        envvar="POIROTD_EVAL_DATA",
        help="the data folder holding blame/, whowhen/ and tracertraj/ (docs/evaluation.md says "
        "where to get them)",
    ),
]
CaseArgument = Annotated[
    str,
    typer.Argument(
        help="DATASET:CASE_ID (e.g. whowhen:12, whowhen-hand-crafted:3) or a one-case JSON file"
    ),
]
MethodOption = Annotated[
    InvestigationMethod,
    typer.Option(
        help="poirot: the five-phase protocol; baseline: one all-at-once LLM call; echo: a "
        "panel of analysts with consensus; errorprobe: MAST tags, backward trace, checked "
        "diagnosis; ensemble: the spec's members combined",
    ),
]


def load_case(ref: str, data_dir: Path) -> EvalCase:
    """The case a command names, or exit 2 saying why it cannot be had."""
    from poirot_eval.selection import resolve_case

    try:
        return resolve_case(ref, data_dir)
    except (OSError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc


@app.command("run")
def run_command(
    out: Annotated[
        Path, typer.Option(help="run directory: results.jsonl and run.json (resumed if present)")
    ],
    dataset: Annotated[
        Benchmark | None, typer.Option(help="a benchmark of the data folder (or --cases)")
    ] = None,
    cases: Annotated[
        Path | None,
        typer.Option(
            help="a folder of one-case JSON files instead of a dataset: the variants folder "
            "`poirotd campaign run` wrote",
        ),
    ] = None,
    data_dir: DataDirOption = Path("data"),
    subset: Annotated[
        Subset | None,
        typer.Option(
            help="whowhen: algorithm-generated (AG2 CaptainAgent, the default) or hand-crafted "
            "(Magentic-One), read from whowhen/Algorithm-Generated or whowhen/Hand-Crafted",
        ),
    ] = None,
    method: MethodOption = "poirot",
    ids: Annotated[
        str | None, typer.Option(help="comma-separated case ids to keep (default: all)")
    ] = None,
    offset: Annotated[int, typer.Option(min=0, help="skip this many selected cases")] = 0,
    limit: Annotated[int | None, typer.Option(min=1, help="at most this many cases")] = None,
    model_path: ModelPathOption = None,
    context_tokens: ContextTokensOption = None,
    threads: ThreadsOption = None,
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    structured_output: StructuredOutputOption = "json_schema",
    case_timeout: Annotated[
        float | None, typer.Option(min=1, help="seconds a case may take (default: no limit)")
    ] = None,
    retry_failed: Annotated[
        bool, typer.Option(help="run again the cases recorded as failed or timed out")
    ] = False,
    concurrency: Annotated[
        int,
        typer.Option(
            min=1,
            help="cases investigated at once, for a server that batches requests (vLLM). The "
            "embedded model answers one request at a time: to use more cores with it, start "
            "this command once per core; the processes share the cases",
        ),
    ] = 1,
    reuse_members: Annotated[
        bool,
        typer.Option(
            help="ensemble: combine the member lines this directory already holds for a case "
            "(same model) instead of running the members again; the line says so (ensemble_of)",
        ),
    ] = True,
) -> None:
    """Run cases through the daemon's core, one fresh store per case and one model for all.

    One line per case is appended to OUT/results.jsonl as soon as the case finishes; rerunning
    the same command skips the cases already there, so an interrupted run resumes.
    """
    from poirot_eval.journal import RunJournal, RunMismatchError
    from poirot_eval.loaders import source
    from poirot_eval.progress import RunProgress
    from poirot_eval.runner import run_cases
    from poirot_eval.selection import read_case_folder, select_cases
    from poirotd.observability import logs

    llm = llm_spec(model_path, context_tokens, threads, base_url, model, structured_output)
    if concurrency > 1 and not isinstance(llm, OpenAILLMSpec):
        typer.echo(
            "--concurrency needs a server backend (--base-url): the embedded model answers one "
            "request at a time",
            err=True,
        )
        raise typer.Exit(2)
    if (dataset is None) == (cases is None):
        typer.echo("name the cases: --dataset or --cases, one of the two", err=True)
        raise typer.Exit(2)
    chosen = [i.strip() for i in ids.split(",") if i.strip()] if ids else None
    named: Dataset = "campaign" if dataset is None else _with_subset(dataset, subset)
    try:
        selected = (
            select_cases(named, data_dir, ids=chosen, offset=offset, limit=limit)
            if cases is None
            else read_case_folder(cases, ids=chosen, offset=offset, limit=limit)
        )
    except KeyError as exc:
        typer.echo(f"cannot load {named}: {exc.args[0]}", err=True)
        raise typer.Exit(2) from exc
    except (OSError, ValueError) as exc:
        typer.echo(f"cannot load {named}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if not selected:
        where = cases if cases is not None else source(named, data_dir)
        typer.echo(f"cannot load {named}: no cases selected in {where}", err=True)
        raise typer.Exit(2)
    journal = RunJournal(out)
    try:
        journal.begin(
            dataset=named,
            method=method,
            llm=llm.model_dump(mode="json"),
            settings={
                "cases": None if cases is None else str(cases),
                "ids": chosen,
                "offset": offset,
                "limit": limit,
                "case_timeout": case_timeout,
                "retry_failed": retry_failed,
                "concurrency": concurrency,
                "reuse_members": reuse_members,
            },
        )
    except RunMismatchError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    logs.configure("error", "console")
    console = Console()
    progress = RunProgress(console)
    try:
        with progress:
            asyncio.run(
                run_cases(
                    selected,
                    journal,
                    method=method,
                    llm=llm,
                    observer=progress,
                    case_timeout=case_timeout,
                    retry=("failed", "timeout") if retry_failed else (),
                    concurrency=concurrency,
                    reuse_members=reuse_members,
                )
            )
    except KeyboardInterrupt:
        console.print(
            f"interrupted: {progress.ok + progress.failed} cases recorded this time in "
            f"{journal.results_path}; run the same command again to resume"
        )
        raise typer.Exit(130) from None
    console.print(f"{progress.ok} ok, {progress.failed} not ok; results in {journal.results_path}")


@app.command("report")
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory of `poirotd eval run`")],
) -> None:
    """Score a run directory's results and write the report beside them."""
    from poirot_eval.journal import RunJournal
    from poirot_eval.report import render_report

    journal = RunJournal(run_dir)
    results = journal.results()
    if not results:
        typer.echo(f"no results in {journal.results_path}", err=True)
        raise typer.Exit(2)
    typer.echo(str(render_report(results, run_dir)))


@app.command("spec")
def spec_command(
    case: CaseArgument,
    output: Annotated[Path, typer.Option("--output", "-o", help="where to write the YAML spec")],
    data_dir: DataDirOption = Path("data"),
) -> None:
    """Write a case's system spec as YAML, for a daemon that `poirotd replay` can feed it to."""
    spec = load_case(case, data_dir).spec
    output.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    typer.echo(f"{output}: spec of system {spec.system.name!r} ({len(spec.agents)} agents)")


@app.command("export")
def export_command(
    case: CaseArgument,
    output: Annotated[Path, typer.Option("--output", "-o", help="where to write the case (JSON)")],
    data_dir: DataDirOption = Path("data"),
) -> None:
    """Write a case as a one-case JSON file: the system spec, the session and the truth, which
    `poirotd replay`, `eval spec` and `eval export` itself read back."""
    loaded = load_case(case, data_dir)
    output.write_text(loaded.model_dump_json(indent=1))
    typer.echo(
        f"{output}: case {loaded.dataset}:{loaded.case_id}, {len(loaded.messages)} messages, "
        f"{len(loaded.spec.agents)} agents"
    )


@app.command("import-run")
def import_run_command(
    run_file: Annotated[Path, typer.Argument(help="a run recorded by the POIROT web tool (JSON)")],
    data_dir: DataDirOption = Path("data"),
    zero_position: Annotated[
        ZeroPosition,
        typer.Option(
            help="an agent the tool recorded at an all-zero position: as-recorded (keep it, "
            "which reproduces the tool's weights) or own-region (place it at its own region, "
            "as poirotd does)",
        ),
    ] = "as-recorded",
    case_out: Annotated[
        Path | None,
        typer.Option(help="write the run's session as a one-case JSON file (replay, eval spec)"),
    ] = None,
    session_end: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="the session is the first N chat-log entries (default: those before the "
            "tool's own POIROT run)",
        ),
    ] = None,
) -> None:
    """Re-aggregate a recorded POIROT web-tool run with poirotd's Phase V and compare it with
    the recorded weights and scores; exit 1 when they differ beyond the recorded rounding."""
    from poirot_eval.poirot_runs import (
        SCORE_TOLERANCE,
        WEIGHT_TOLERANCE,
        benchmark_spec,
        read_run,
        reaggregate,
        run_case,
    )

    try:
        run = read_run(run_file)
    except ValueError as exc:
        typer.echo(f"cannot import: {exc}", err=True)
        raise typer.Exit(2) from exc
    try:
        spec = benchmark_spec(run, data_dir)
        result = reaggregate(run, spec, zero_position)
    except (OSError, ValueError) as exc:
        typer.echo(f"cannot import {run_file}: {exc}", err=True)
        raise typer.Exit(2) from exc
    console = Console()
    for table in _comparison_tables(result):
        console.print(table)
    verdict = (
        f"largest differences: weight {result.weight_error:.2g} (tolerance {WEIGHT_TOLERANCE:g}), "
        f"score {result.score_error:.2g} (tolerance {SCORE_TOLERANCE:g}); "
        f"winner {list(result.top)} (recorded {list(result.recorded_top)})"
    )
    if result.tie_broken_by_first:
        tied = ", ".join(result.region_ids[j] for j in result.top)
        verdict += (
            f"; a tie between {tied}, which the tool broke by taking the first "
            "(numpy's argmax); poirotd reports the tie"
        )
    console.print(("reproduced: " if result.agrees else "NOT reproduced: ") + verdict)
    if case_out is not None:
        try:
            case = run_case(run, spec, session_end=session_end, source=str(run_file))
        except ValueError as exc:
            typer.echo(f"no case written: {exc}", err=True)
            raise typer.Exit(2) from exc
        case_out.write_text(case.model_dump_json(indent=1))
        console.print(
            f"{case_out}: case {case.dataset}:{case.case_id}, {len(case.messages)} session "
            "messages (poirotd replay / eval spec accept it)"
        )
    if not result.agrees:
        raise typer.Exit(1)


def _comparison_tables(result: Reaggregation) -> list[Table]:
    ids = result.region_ids

    def at(index: int | None) -> str:
        return ids[index] if index is not None else "(all zeros)"

    agents = Table(title=f"Votes re-weighed ({result.convention})")
    for column in ("agent", "position recorded", "position used", "β", "weight recorded",
                   "weight", "Δ"):  # fmt: skip
        agents.add_column(column)
    for a in result.agents:
        agents.add_row(
            a.agent_id,
            at(a.recorded_position),
            at(a.position),
            f"{a.beta:.4f}",
            f"{a.recorded_weight:.4f}",
            f"{a.weight:.4f}",
            f"{a.weight - a.recorded_weight:+.1e}",
        )
    regions = Table(title="Scores")
    for column in ("region", "score recorded", "score", "Δ"):
        regions.add_column(column)
    for region, recorded, computed in zip(ids, result.recorded_scores, result.scores, strict=True):
        regions.add_row(region, f"{recorded:.4f}", f"{computed:.4f}", f"{computed - recorded:+.1e}")
    return [agents, regions]


def _with_subset(dataset: Benchmark, subset: Subset | None) -> Benchmark:
    """`--dataset whowhen --subset hand-crafted` is the dataset whowhen-hand-crafted."""
    if subset is None:
        return dataset
    if dataset != "whowhen":
        raise typer.BadParameter("only --dataset whowhen has subsets", param_hint="--subset")
    return SUBSETS[subset]


@replay_app.command()
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

    from poirot_eval.replay import replay as replay_case
    from poirot_eval.session import session_id_of

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
        raise refused(target, exc) from exc
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if watch and investigation is not None and investigation.error:
        raise typer.Exit(1)
