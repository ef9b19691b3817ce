"""What the commands that talk to a running daemon share: one set of options to reach it,
added to each such command by `@connects`, one way to call the daemon and report its refusal,
and one --json form of its answers.

The options are --target and those of a locked port (docs/operating/security.md): --tls, --ca,
--cert, --key and --token-file, the last four also read from POIROTD_CLIENT_CA_FILE, ..._CERT_FILE,
..._KEY_FILE and ..._TOKEN_FILE."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    import grpc
    from google.protobuf.message import Message
    from rich.console import RenderableType

    from poirotd.client.wire import DaemonTls, PoirotClient

T = TypeVar("T")

DEFAULT_TARGET = "127.0.0.1:50051"
TargetOption = Annotated[str, typer.Option(help="the running daemon's gRPC address (host:port)")]
TlsOption = Annotated[
    bool, typer.Option("--tls", help="use TLS, trusting the system's CAs unless --ca is given")
]
CaOption = Annotated[
    Path | None,
    typer.Option(envvar="POIROTD_CLIENT_CA_FILE", help="CA of the daemon's certificate (TLS)"),
]
CertOption = Annotated[
    Path | None,
    typer.Option(envvar="POIROTD_CLIENT_CERT_FILE", help="this client's certificate (mTLS)"),
]
KeyOption = Annotated[
    Path | None,
    typer.Option(envvar="POIROTD_CLIENT_KEY_FILE", help="this client's private key (mTLS)"),
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(envvar="POIROTD_CLIENT_TOKEN_FILE", help="a file holding the bearer token"),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json", help="print the daemon's answer as JSON (protobuf's JSON mapping), for scripts"
    ),
]

# The parameters `connects` adds, as typer reads them: (name, annotation, default).
_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("target", TargetOption, DEFAULT_TARGET),
    ("tls", TlsOption, False),
    ("ca", CaOption, None),
    ("cert", CertOption, None),
    ("key", KeyOption, None),
    ("token_file", TokenFileOption, None),
)


@dataclass(frozen=True)
class Connection:
    """A daemon as the options name it: where, over which TLS, with which token."""

    target: str
    tls: DaemonTls | None = None
    token: str | None = None

    @classmethod
    def from_options(
        cls,
        target: str,
        tls: bool,
        ca: Path | None,
        cert: Path | None,
        key: Path | None,
        token_file: Path | None,
    ) -> Connection:
        """TLS is on with --tls, --ca or a certificate; exits 2 naming a file that cannot be
        read."""
        from poirotd.client.wire import DaemonTls

        try:
            client_tls = DaemonTls.from_files(ca, cert, key) if tls or ca or cert or key else None
            token = token_file.read_text(encoding="utf-8").strip() if token_file else None
        except (OSError, ValueError) as exc:
            typer.echo(f"cannot use the client's credentials: {exc}", err=True)
            raise typer.Exit(2) from exc
        return cls(target, client_tls, token)

    def client(self) -> PoirotClient:
        """A new client (its own channel): open it in the event loop that uses it."""
        from poirotd.client.wire import PoirotClient

        return PoirotClient(self.target, tls=self.tls, token=self.token)

    def call(self, call: Callable[[PoirotClient], Awaitable[T]]) -> T:
        """`call` on a client of the daemon, in an event loop of its own; a refusal or an
        unreachable daemon exits 1 (`refused`)."""
        import grpc

        async def once() -> T:
            async with self.client() as client:
                return await call(client)

        try:
            return asyncio.run(once())
        except grpc.aio.AioRpcError as exc:
            raise refused(self.target, exc) from exc


def connects(command: Callable[..., None]) -> Callable[..., None]:
    """Gives a command the options that reach a daemon; it receives them as one `Connection` in
    its `daemon` parameter. One definition of the options for every such command, so their
    names, variables and help never drift apart."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for name, p in signature.parameters.items() if name != "daemon"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=default)
        for name, kind, default in _OPTIONS
    ]

    @functools.wraps(command)
    def with_connection(**options: Any) -> None:
        daemon = Connection.from_options(*(options.pop(name) for name, _, _ in _OPTIONS))
        command(**options, daemon=daemon)

    with_connection.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*own, *added]
    )
    return with_connection


def refused(target: str, exc: grpc.aio.AioRpcError) -> typer.Exit:
    """Says on stderr what the daemon answered; the caller raises the exit (1) it returns."""
    typer.echo(f"the daemon at {target} refused: {exc.code().name}: {exc.details()}", err=True)
    return typer.Exit(1)


def print_json(message: Message) -> None:
    """One protobuf message in its JSON mapping (field names in lowerCamelCase, 64-bit integers
    as strings, default values left out): `json_format.Parse` reads it back."""
    from google.protobuf import json_format

    typer.echo(json_format.MessageToJson(message, indent=2, ensure_ascii=False))


def print_page(
    page: Message, next_page_token: str, table: Callable[[], RenderableType], *, as_json: bool
) -> None:
    """One page of a listing: its JSON, or `table()` with the way to the next page on stderr,
    said alike by every command that lists."""
    if as_json:
        print_json(page)
        return
    from poirotd.cli import render

    render.console().print(table())
    if next_page_token:
        typer.echo(f"more: --page-token {next_page_token}", err=True)
