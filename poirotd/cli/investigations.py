"""`poirotd investigations`: list, show, trigger and watch a running daemon's investigations
over its gRPC API (the Investigations service), as an operator would from a shell."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from poirotd.cli.connection import Connection, JsonOption, connects, print_json, print_page, refused
from poirotd.model import InvestigationMethod, InvestigationState

if TYPE_CHECKING:
    from poirotd.api.poirot.v1 import poirot_pb2 as pb

app = typer.Typer(
    no_args_is_help=True,
    help="List, show, trigger and watch the investigations of a running daemon.",
)

# A lost Watch is opened again after this long, doubling up to the most.
_FIRST_RETRY_SECONDS = 0.25
_MOST_RETRY_SECONDS = 5.0


def _pb_state(state: InvestigationState | None) -> pb.InvestigationState.ValueType:
    from poirotd.api.poirot.v1 import poirot_pb2 as pb

    name = "UNSPECIFIED" if state is None else state.name
    return pb.InvestigationState.Value(f"INVESTIGATION_STATE_{name}")


@app.command("list")
@connects
def list_command(
    daemon: Connection,
    session: Annotated[str, typer.Option(help="only this session's")] = "",
    state: Annotated[InvestigationState | None, typer.Option(help="only in this state")] = None,
    method: Annotated[InvestigationMethod | None, typer.Option(help="only by this method")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="at most this many")] = 20,
    page_token: Annotated[str, typer.Option(help="the next page, as a previous list gave it")] = "",
    canaries: Annotated[
        bool, typer.Option("--canaries", help="the canaries' shadow investigations instead")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Investigations, newest first (List)."""
    from poirotd.cli import render

    page = daemon.call(
        lambda client: client.list_investigations(
            session_id=session,
            state=_pb_state(state),
            method=method or "",
            page_size=limit,
            page_token=page_token,
            canaries=canaries,
        )
    )
    print_page(
        page,
        page.next_page_token,
        lambda: render.investigations_table(page.investigations),
        as_json=as_json,
    )


@app.command("show")
@connects
def show_command(
    daemon: Connection,
    investigation_id: Annotated[str, typer.Argument(help="the investigation")],
    transcript: Annotated[
        bool,
        typer.Option(
            "--transcript",
            help="also every prompt and answer of the interrogation (needs the auditor role)",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """One investigation in full (Get).

    Its attribution (scores as bars, the decision and its rule, a tie), each vote with its
    weight, position and justification, the Phase II reports, the step, what degraded it,
    injection findings, the triggers coalesced into it; with --transcript every prompt and
    answer.
    """
    from poirotd.cli import render

    record = daemon.call(lambda client: client.get(investigation_id, include_exchanges=transcript))
    if as_json:
        print_json(record)
        return
    out = render.console()
    out.print(render.investigation(record))
    if transcript:
        out.print(render.transcript(record.exchanges))


@app.command("trigger")
@connects
def trigger_command(
    daemon: Connection,
    session_id: Annotated[str, typer.Argument(help="the stored session to investigate")],
    reason: Annotated[str, typer.Option(help="what happened: the agents are told it")],
    method: Annotated[InvestigationMethod, typer.Option(help="the attribution method")] = "poirot",
    as_json: JsonOption = False,
) -> None:
    """Open an investigation over a session (Trigger; the operator role).

    When the session has one by the same method open, the trigger joins it and that one is
    shown.
    """
    from poirotd.cli import render

    record = daemon.call(lambda client: client.trigger(session_id, reason, method))
    if as_json:
        print_json(record)
        return
    state = render.state_name(record.state)
    if record.coalesced:  # a new investigation has none: this trigger joined an open one
        typer.echo(
            f"joined the open investigation {record.investigation_id} ({state}, opened for: "
            f"{render.plain(record.reason).plain})"
        )
    else:
        typer.echo(f"{record.investigation_id}: {state} ({record.method})")
    typer.echo(f"follow it: poirotd investigations watch {record.investigation_id}")


@app.command("watch")
@connects
def watch_command(
    daemon: Connection,
    investigation_id: Annotated[
        str, typer.Argument(help="only this investigation's events, until it ends (default: all)")
    ] = "",
    after: Annotated[
        int, typer.Option(min=0, help="start after this event id (the last one a watch printed)")
    ] = 0,
    reconnect_seconds: Annotated[
        float,
        typer.Option(min=0, help="how long to keep reconnecting to a daemon that went away"),
    ] = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Follow investigation events as they happen (Watch).

    First the stored ones after --after, then new ones. A lost connection is resumed after the
    last event printed, so none is missed or repeated. With an id it ends with that
    investigation; without, at Ctrl-C. --json prints one event per line.
    """
    from google.protobuf import json_format

    from poirotd.cli import render

    out = render.console()

    def show(event: pb.InvestigationEvent) -> None:
        if as_json:
            typer.echo(json_format.MessageToJson(event, indent=None, ensure_ascii=False))
        else:
            out.print(render.event_line(event))

    try:
        asyncio.run(follow(daemon, investigation_id, after, reconnect_seconds, show))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


async def follow(
    daemon: Connection,
    investigation_id: str,
    after: int,
    reconnect_seconds: float,
    show: Callable[[pb.InvestigationEvent], None],
) -> None:
    """Shows the events after `after`, then new ones. When the connection is lost (UNAVAILABLE,
    or the stream cancelled by a daemon stopping) a new one resumes after the last event shown:
    event ids are the store's, so nothing is lost or shown twice. Exits 1 once no connection
    could be had for `reconnect_seconds`, or on any other refusal."""
    import grpc

    from poirotd.api.poirot.v1 import poirot_pb2 as pb

    loop = asyncio.get_running_loop()
    last, lost_at, delay = after, None, _FIRST_RETRY_SECONDS
    while True:
        try:
            async with daemon.client() as client:
                call = client.investigations.Watch(
                    pb.WatchRequest(investigation_id=investigation_id, after_event_id=last)
                )
                await call.wait_for_connection()
                lost_at, delay = None, _FIRST_RETRY_SECONDS
                async for event in call:
                    show(event)
                    last = event.event_id
            if investigation_id:
                return  # the daemon ends a single investigation's watch with it
            why = "the daemon ended the stream"  # draining: another replica may take over
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise refused(daemon.target, exc) from exc
            why = f"{exc.code().name}: {exc.details()}"
            lost_at = loop.time() if lost_at is None else lost_at
            if loop.time() - lost_at > reconnect_seconds:
                typer.echo(
                    f"lost the daemon at {daemon.target} for over {reconnect_seconds:g} s ({why});"
                    f" resume with --after {last}",
                    err=True,
                )
                raise typer.Exit(1) from exc
        typer.echo(f"connection lost ({why}); resuming after event {last}", err=True)
        await asyncio.sleep(delay)
        delay = min(delay * 2, _MOST_RETRY_SECONDS)
