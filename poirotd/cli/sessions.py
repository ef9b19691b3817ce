"""`poirotd sessions`: the sessions a running daemon stored, over its gRPC API (the Sessions
service): to find what an investigation saw."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from poirotd.cli.connection import Connection, JsonOption, connects, print_json, print_page

if TYPE_CHECKING:
    from poirotd.api.poirot.v1 import poirot_pb2 as pb
    from poirotd.client.wire import PoirotClient

app = typer.Typer(
    no_args_is_help=True,
    help="List and show the sessions a running daemon stored.",
)

# The investigations `show` lists under a session, newest first.
_SHOWN_INVESTIGATIONS = 20


@app.command("list")
@connects
def list_command(
    daemon: Connection,
    limit: Annotated[int, typer.Option(min=1, max=500, help="at most this many")] = 20,
    page_token: Annotated[str, typer.Option(help="the next page, as a previous list gave it")] = "",
    as_json: JsonOption = False,
) -> None:
    """Sessions, newest started first, with their message and investigation counts."""
    from poirotd.cli import render

    page = daemon.call(lambda client: client.list_sessions(page_size=limit, page_token=page_token))
    print_page(
        page, page.next_page_token, lambda: render.sessions_table(page.sessions), as_json=as_json
    )


@app.command("show")
@connects
def show_command(
    daemon: Connection,
    session_id: Annotated[str, typer.Argument(help="the session")],
    messages: Annotated[
        bool,
        typer.Option("--messages", help="also its messages, a page at a time (the auditor role)"),
    ] = False,
    from_index: Annotated[int, typer.Option(min=0, help="the page's first message index")] = 0,
    max_messages: Annotated[
        int, typer.Option(min=1, max=1000, help="the most messages on the page")
    ] = 100,
    as_json: JsonOption = False,
) -> None:
    """One session: times, counts, telemetry, investigations (Get).

    Its times, labels and counts, a summary of its newest telemetry and its latest
    investigations; with --messages what its agents said. --json prints the SessionDetail alone.
    """
    from poirotd.cli import render

    async def read(client: PoirotClient) -> tuple[pb.SessionDetail, list[pb.Investigation]]:
        detail = await client.get_session(
            session_id,
            include_messages=messages,
            from_index=from_index,
            max_messages=max_messages,
        )
        if as_json:
            return detail, []
        found = await client.list_investigations(
            session_id=session_id, page_size=_SHOWN_INVESTIGATIONS
        )
        return detail, list(found.investigations)

    detail, investigations = daemon.call(read)
    if as_json:
        print_json(detail)
        return
    render.console().print(render.session(detail, investigations))
