"""``python -m hwbridge``: run the bridge, or drive a broker with simulated telemetry.

    python -m hwbridge run --config bridge.yaml
    python -m hwbridge simulate exo --broker 127.0.0.1:1883 --rate 2000 \\
        --fault "proprioception_score:offset:magnitude=-4,start_s=10"
    python -m hwbridge simulate market --shock "gap:start_s=30,magnitude=-0.08"   # JSON lines
    python -m hwbridge simulate market --replay day.csv --speed 60 --broker 127.0.0.1:1883
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import structlog
import typer
from pydantic import BaseModel, ValidationError

from hwbridge import exo, market
from hwbridge.bridge import Bridge
from hwbridge.config import BridgeConfig, BrokerConfig, ConfigError, load_config
from hwbridge.deadletter import DeadLetterStore
from hwbridge.forward import Forwarder, ForwardError
from hwbridge.mqtt import MqttPublisher

log = structlog.get_logger("hwbridge")

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
simulate = typer.Typer(no_args_is_help=True, help="Publish simulated telemetry or market data.")
app.add_typer(simulate, name="simulate")

Publish = Callable[[str, bytes], Awaitable[None]]
M = TypeVar("M", bound=BaseModel)

LogLevel = Annotated[str, typer.Option(help="debug | info | warning | error")]
LogFormat = Annotated[str, typer.Option(help="json | console")]
BrokerOption = Annotated[
    str | None, typer.Option(help="HOST:PORT of the MQTT broker to publish to")
]
UsernameOption = Annotated[str | None, typer.Option(help="MQTT user name")]
# The password is never an argument (other users see arguments in `ps`).
PASSWORD_ENV = "HWBRIDGE_MQTT_PASSWORD"
PasswordFileOption = Annotated[
    Path | None,
    typer.Option(help=f"file holding the MQTT password (default: ${PASSWORD_ENV} if set)"),
]
CaFileOption = Annotated[
    Path | None,
    typer.Option(help="TLS: the CA the broker's certificate must chain to (turns TLS on)"),
]
CertFileOption = Annotated[
    Path | None, typer.Option(help="TLS: client certificate (PEM), with --key-file")
]
KeyFileOption = Annotated[Path | None, typer.Option(help="TLS: the client certificate's key")]
DurationOption = Annotated[
    float | None, typer.Option(help="simulated seconds to run (default: until stopped)")
]
SeedOption = Annotated[int | None, typer.Option(help="random seed, for reproducible runs")]


def _configure_logs(level: str, fmt: str) -> None:
    """structlog's default processors on stderr, the level filtered, JSON lines if asked."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.reset_defaults()
    defaults = structlog.get_config()["processors"][:-1]  # its own last one renders
    structlog.configure(
        processors=[*defaults, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )


@app.command()
def run(
    config: Annotated[Path, typer.Option("--config", "-c", help="bridge YAML file")],
    log_level: LogLevel = "info",
    log_format: LogFormat = "json",
) -> None:
    """Forward the configured inputs to poirotd until SIGTERM or SIGINT."""
    try:
        bridge_config = load_config(config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    _configure_logs(log_level, log_format)
    try:
        asyncio.run(_run_bridge(bridge_config))
    except ForwardError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc


async def _run_bridge(config: BridgeConfig) -> None:
    dead_letters = DeadLetterStore(
        config.dead_letter, log_interval_s=config.pipeline.log_interval_s
    )
    try:
        async with Forwarder(config.poirotd, config.session_id, dead_letters) as forwarder:
            bridge = Bridge(config, forwarder, dead_letters)

            async def report() -> None:
                while True:
                    await asyncio.sleep(config.pipeline.log_interval_s)
                    log.info("bridge stats", **bridge.stats(), forwarder=asdict(forwarder.stats))

            async with _until_signalled() as stopped:
                running = asyncio.create_task(bridge.run())
                waiting = asyncio.create_task(stopped.wait())
                reporting = asyncio.create_task(report())
                try:
                    await asyncio.wait([running, waiting], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (reporting, waiting, running):
                        task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await running  # re-raises the ForwardError that ended the inputs, if any
            log.info("bridge stopped", **bridge.stats(), forwarder=asdict(forwarder.stats))
    finally:
        dead_letters.close()


@contextlib.asynccontextmanager
async def _until_signalled() -> AsyncIterator[asyncio.Event]:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopped.set)
    try:
        yield stopped
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


# ------------------------------------------------------------------ simulators


@simulate.command("exo")
def simulate_exo(
    broker: BrokerOption = "127.0.0.1:1883",
    patient: Annotated[str, typer.Option(help="patient id in the topics d2w/<patient>/...")] = "p1",
    rate: Annotated[float, typer.Option(help="aggregate samples/s, 100..10000")] = 1000.0,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            help="SIGNAL:KIND[:key=value,...], KIND one of offset, drift, spikes, stuck, "
            "dropout; keys start_s, duration_s, magnitude, probability. Repeatable."
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="seconds between publishes")] = 0.02,
    duration: DurationOption = None,
    seed: SeedOption = None,
    username: UsernameOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    cert_file: CertFileOption = None,
    key_file: KeyFileOption = None,
    log_level: LogLevel = "info",
) -> None:
    """Publish D2W gait telemetry (QoS 1) in the layout hwbridge/bridge.example.yaml decodes."""
    faults = [_spec(exo.FaultSpec, text, ("signal", "kind")) for text in fault or ()]
    sim_config = _validated(exo.ExoSimConfig, rate_hz=rate, faults=faults, seed=seed)
    target = _broker(
        broker or "127.0.0.1:1883", username, password_file, ca_file, cert_file, key_file
    )
    _configure_logs(log_level, "console")

    async def main() -> None:
        simulator = exo.ExoSimulator(sim_config)
        async with MqttPublisher(target) as publisher:
            async for until in _paced(interval, duration):
                for topic, payload in exo.messages(simulator.advance(until), patient):
                    await publisher.publish(topic, payload)

    asyncio.run(main())


@simulate.command("market")
def simulate_market(
    broker: BrokerOption = None,
    topic: Annotated[str, typer.Option(help="MQTT topic for the JSON lines")] = "market/ticks",
    symbol: Annotated[
        list[str] | None, typer.Option(help="SYMBOL=PRICE[:SIGMA], repeatable (GBM)")
    ] = None,
    shock: Annotated[
        list[str] | None,
        typer.Option(
            help="KIND[:key=value,...], KIND one of gap, vol_spike, stale; keys symbol, "
            "start_s, duration_s, magnitude. Repeatable."
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="seconds between ticks (GBM)")] = 0.1,
    replay: Annotated[
        Path | None, typer.Option(help="replay this CSV (ticks or bars) instead of simulating")
    ] = None,
    speed: Annotated[float, typer.Option(help="replay time compression")] = 1.0,
    rebase: Annotated[bool, typer.Option(help="replayed timestamps start now")] = False,
    duration: DurationOption = None,
    seed: SeedOption = None,
    username: UsernameOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    cert_file: CertFileOption = None,
    key_file: KeyFileOption = None,
    log_level: LogLevel = "info",
) -> None:
    """Publish ticks as JSON lines to an MQTT topic, or to stdout without --broker (pipe it
    into e.g. `socat - TCP-LISTEN:9100` to serve a TCP feed)."""
    shocks = [_spec(market.ShockSpec, text, ("kind",)) for text in shock or ()]
    symbols = [_symbol(text) for text in symbol or ("ACME=100",)]
    sim_config = _validated(
        market.MarketSimConfig,
        symbols=symbols,
        tick_interval_s=interval,
        shocks=shocks,
        seed=seed,
    )
    target = (
        None
        if broker is None
        else _broker(broker, username, password_file, ca_file, cert_file, key_file)
    )
    _configure_logs(log_level, "console")

    async def quotes() -> AsyncIterator[market.Quote]:
        if replay is not None:
            rebase_to = datetime.now(UTC) if rebase else None
            async for quote in market.replay(
                market.read_csv(replay), speed=speed, rebase_to=rebase_to
            ):
                yield quote
            return
        simulator = market.MarketSimulator(sim_config)
        async for until in _paced(interval, duration):
            for tick in simulator.advance(until):
                yield tick

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            if target is None:
                publish: Publish = _stdout
            else:
                publish = (await stack.enter_async_context(MqttPublisher(target))).publish
            async for quote in quotes():
                await publish(topic, market.to_line(quote))

    try:
        asyncio.run(main())
    except ValueError as exc:  # a malformed CSV names its line
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc


async def _stdout(topic: str, line: bytes) -> None:
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()


async def _paced(interval_s: float, duration_s: float | None) -> AsyncIterator[float]:
    """Simulated time in steps of `interval_s`, each yielded when the wall clock reaches it."""
    loop = asyncio.get_running_loop()
    started, step = loop.time(), 0
    while duration_s is None or step * interval_s < duration_s:
        step += 1
        until = step * interval_s if duration_s is None else min(step * interval_s, duration_s)
        await asyncio.sleep(max(0.0, started + until - loop.time()))
        yield until


# ------------------------------------------------------------------ option parsing


def _spec(model: type[M], text: str, positional: tuple[str, ...]) -> M:
    """ "a:b:k=v,k2=v2" -> model(positional[0]=a, positional[1]=b, k=v, k2=v2)."""
    parts = text.split(":", len(positional))
    values: dict[str, str] = dict(zip(positional, parts, strict=False))
    if len(parts) > len(positional):
        for pair in filter(None, parts[-1].split(",")):
            key, sep, value = pair.partition("=")
            if not sep:
                raise typer.BadParameter(f"{text!r}: expected key=value, got {pair!r}")
            values[key.strip()] = value.strip()
    return _validated(model, **values)


def _validated(model: type[M], **values: Any) -> M:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _symbol(text: str) -> market.SymbolSpec:
    name, _, rest = text.partition("=")
    price, _, sigma = rest.partition(":")
    values: dict[str, str] = {"symbol": name, "price": price}
    if sigma:
        values["sigma"] = sigma
    return _validated(market.SymbolSpec, **values)


def _broker(
    address: str,
    username: str | None,
    password_file: Path | None,
    ca_file: Path | None,
    cert_file: Path | None,
    key_file: Path | None,
) -> BrokerConfig:
    host, _, port = address.rpartition(":")
    password: dict[str, Any] | None = None
    if password_file is not None:
        password = {"file": password_file}
    elif os.environ.get(PASSWORD_ENV):
        password = {"env": PASSWORD_ENV}
    tls = None
    if ca_file is not None or cert_file is not None:
        tls = {"ca_file": ca_file, "cert_file": cert_file, "key_file": key_file}
    return _validated(
        BrokerConfig,
        host=host or "127.0.0.1",
        port=port,
        username=username,
        password=password,
        tls=tls,
    )


if __name__ == "__main__":
    app()
