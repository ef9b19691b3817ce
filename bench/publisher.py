"""The benchmark's MQTT publisher, run as its own process: ``python -m bench.publisher ...``.

It speaks MQTT 3.1.1 over a raw socket (CONNECT, QoS 1 PUBLISH, PUBACK) because paho-mqtt tops
out near 5k QoS 1 publishes/s on this machine, below what a bare subscriber drains: with paho
the publisher would be the limit being measured. A window of un-acked publishes keeps the broker
busy without letting it queue without bound.

Protocol on stdio: prints ``ready`` once connected, publishes after a line on stdin, prints one
JSON line of results and exits. Every loop is bounded by a message count or a duration.
With --ca-file it speaks MQTT over TLS (with --cert-file/--key-file, a client certificate), with
--username/--password-file it logs in.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Payload builders: (index, send time) -> (topic, payload).
Layout = Callable[[int, float], tuple[bytes, bytes]]

# `sample`: one reading per message, JSON, over SIGNALS topics (the per-message worst case).
SIGNALS = 10
# `frames`: one struct frame of FRAME_SIGNALS float32 readings after a float64 send time; each
# signal spikes to SPIKE once per SPIKE_PERIOD frames, signals staggered, else stays near 0.
FRAME_SIGNALS = 50
SPIKE = 10.0
SPIKE_PERIOD = 200


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: bytes) -> bytes:
    return struct.pack("!H", len(text)) + text


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _remaining_length(len(body)) + body


def sample_layout(index: int, now: float) -> tuple[bytes, bytes]:
    value = round(random.gauss(0.0, 1.0), 4)
    return b"bench/s%d" % (index % SIGNALS), json.dumps({"ts": now, "value": value}).encode()


_FRAME = struct.Struct("<d" + "f" * FRAME_SIGNALS)
_STAGGER = SPIKE_PERIOD / FRAME_SIGNALS


def frame_layout(index: int, now: float) -> tuple[bytes, bytes]:
    values = [
        SPIKE if (index + math.floor(j * _STAGGER)) % SPIKE_PERIOD == 0 else random.random()
        for j in range(FRAME_SIGNALS)
    ]
    return b"bench/frames", _FRAME.pack(now, *values)


LAYOUTS: dict[str, Layout] = {"sample": sample_layout, "frames": frame_layout}


@dataclass(frozen=True)
class Login:
    """A locked broker's demands: TLS (its CA, this client's certificate) and a user."""

    tls: ssl.SSLContext | None = None
    username: str | None = None
    password: str | None = None

    def connect_flags(self) -> tuple[int, bytes]:
        """CONNECT's flag bits for the user and password, and the payload fields after the id."""
        if self.username is None:
            return 0, b""
        flags, fields = 0x80, _string(self.username.encode())
        if self.password is not None:
            flags, fields = flags | 0x40, fields + _string(self.password.encode())
        return flags, fields


class Publisher:
    def __init__(self, port: int, window: int, login: Login = Login()) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if login.tls is not None:
            self._sock = login.tls.wrap_socket(self._sock, server_hostname="127.0.0.1")
        self._window = window
        self._pending = bytearray()
        self._packet_id = 0
        self.sent = 0
        self.acked = 0
        self._ack_bytes = 0
        # Keepalive 0: no PINGREQ needed however long a paced run lasts.
        flags, credentials = login.connect_flags()
        variable = _string(b"MQTT") + bytes([4, 0x02 | flags]) + struct.pack("!H", 0)
        client_id = _string(b"bench-publisher-%d" % port)
        self._sock.sendall(_packet(0x10, variable + client_id + credentials))
        connack = self._recv_exactly(4)
        if connack[0] != 0x20 or connack[3] != 0:
            raise RuntimeError(f"broker refused the connection: {connack!r}")

    def _recv_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("broker closed the connection")
            data += chunk
        return data

    def queue(self, topic: bytes, payload: bytes) -> None:
        self._packet_id = self._packet_id % 65535 + 1
        body = _string(topic) + struct.pack("!H", self._packet_id) + payload
        self._pending += _packet(0x32, body)  # PUBLISH, QoS 1
        self.sent += 1

    def flush(self, *, wait_for_room: bool) -> None:
        """Sends what is queued; reads PUBACKs, blocking while the window is full."""
        if self._pending:
            self._sock.sendall(self._pending)
            self._pending.clear()
        self._sock.setblocking(False)
        try:
            self._read_acks()
        finally:
            self._sock.setblocking(True)
        while wait_for_room and self.sent - self.acked >= self._window:
            self._read_acks()

    def drain(self) -> None:
        self.flush(wait_for_room=False)
        while self.acked < self.sent:
            self._read_acks()

    def _read_acks(self) -> None:
        try:
            data = self._sock.recv(65536)
        except (BlockingIOError, ssl.SSLWantReadError):
            return
        if not data:
            raise RuntimeError("broker closed the connection")
        # The broker sends this client nothing but PUBACKs: 4 bytes each (0x40 0x02 id id).
        self._ack_bytes += len(data)
        self.acked = self._ack_bytes // 4

    def close(self) -> None:
        self._sock.sendall(b"\xe0\x00")  # DISCONNECT
        self._sock.close()


def burst(publisher: Publisher, layout: Layout, messages: int) -> None:
    """As fast as the window allows; payloads are built before the clock starts."""
    prepared = [layout(i, time.time()) for i in range(min(messages, 10_000))]
    for i in range(messages):
        publisher.queue(*prepared[i % len(prepared)])
        if i % 64 == 63:
            publisher.flush(wait_for_room=True)


def paced(publisher: Publisher, layout: Layout, rate: float, seconds: float) -> None:
    """`rate` messages/s for `seconds`, each stamped with the time it is sent."""
    start = time.perf_counter()
    total = int(rate * seconds)
    while publisher.sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        while publisher.sent < due:
            publisher.queue(*layout(publisher.sent, time.time()))
        publisher.flush(wait_for_room=True)
        next_at = start + publisher.sent / rate
        time.sleep(max(0.0, next_at - time.perf_counter()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    parser.add_argument("--window", type=int, default=2000)
    parser.add_argument("--messages", type=int, help="burst: this many, as fast as possible")
    parser.add_argument("--rate", type=float, help="paced: messages per second")
    parser.add_argument("--seconds", type=float, help="paced: for this long")
    parser.add_argument("--ca-file", type=Path, help="TLS: the CA of the broker's certificate")
    parser.add_argument("--cert-file", type=Path, help="TLS: this client's certificate")
    parser.add_argument("--key-file", type=Path, help="TLS: its key")
    parser.add_argument("--username")
    parser.add_argument("--password-file", type=Path)
    args = parser.parse_args()
    publisher = Publisher(args.port, args.window, _login(args))
    print("ready", flush=True)
    sys.stdin.readline()
    started, cpu_before = time.perf_counter(), time.process_time()
    if args.messages is not None:
        burst(publisher, LAYOUTS[args.layout], args.messages)
    else:
        paced(publisher, LAYOUTS[args.layout], args.rate, args.seconds)
    publisher.drain()
    seconds = time.perf_counter() - started
    publisher.close()
    result = {
        "published": publisher.sent,
        "seconds": seconds,
        "cpu_s": time.process_time() - cpu_before,
    }
    print(json.dumps(result), flush=True)


def _login(args: argparse.Namespace) -> Login:
    tls = None
    if args.ca_file is not None:
        tls = ssl.create_default_context(cafile=args.ca_file)
        if args.cert_file is not None:
            tls.load_cert_chain(args.cert_file, args.key_file)
    password = args.password_file.read_text().strip() if args.password_file else None
    return Login(tls, args.username, password)


if __name__ == "__main__":
    main()
