"""`poirotd token`: bearer tokens for the access file (POIROTD_AUTH_FILE), which keeps only their
SHA-256, never the token."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from poirotd.transports.security.access import new_token, token_hash
from poirotd.transports.security.roles import Role

app = typer.Typer(
    no_args_is_help=True,
    help="Make bearer tokens and the access-file lines that grant them roles.",
)

NameOption = Annotated[str, typer.Option(help="who holds the token (logged, audited)")]
RolesOption = Annotated[list[Role], typer.Option("--role", help="a role it grants (repeat)")]


def _line(token: str, name: str, roles: list[Role]) -> str:
    granted = ", ".join(role.value for role in dict.fromkeys(roles))
    return f"{token_hash(token)}: {{name: {json.dumps(name)}, roles: [{granted}]}}"


@app.command("new")
def new_command(name: NameOption, roles: RolesOption) -> None:
    """Print a new random token and its line for the access file's `tokens:` section.

    Give the token to the client (e.g. `poirotd confirm --token-file`); poirotd keeps only the
    hash, so a lost token is replaced, not recovered.
    """
    token = new_token()
    typer.echo(f"token (give it to {name}; it is shown only now):\n  {token}")
    typer.echo(f"under `tokens:` in the access file:\n  {_line(token, name, roles)}")


@app.command("hash")
def hash_command(name: NameOption, roles: RolesOption) -> None:
    """Read a token you already have from standard input and print its access-file line (the
    token never appears on a command line or in shell history)."""
    token = sys.stdin.readline().strip()
    if not token:
        typer.echo("no token on standard input", err=True)
        raise typer.Exit(2)
    typer.echo(_line(token, name, roles))
