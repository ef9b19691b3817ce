"""What a transport's peer address names: the host behind it, whatever connection it came on."""

from __future__ import annotations

from urllib.parse import unquote


def peer_host(peer: str) -> str:
    """The host of a gRPC peer without its port ("ipv4:10.0.0.5:41940" -> "10.0.0.5",
    "ipv6:%5B::1%5D:47932" -> "::1"); any other peer (an HTTP transport's address, a Unix socket's
    path) as it is."""
    peer = unquote(peer)
    scheme, _, address = peer.partition(":")
    if scheme in ("ipv4", "ipv6"):
        return address.rpartition(":")[0].strip("[]") or peer
    return peer
