"""Runs the whole path once, as a user would see it: a real daemon process reading a local
Mosquitto, a session streamed over gRPC, exoskeleton telemetry with a miscalibrated sensor over
MQTT, the rule that fires on it, the investigation it opens followed event by event, the
attribution and the exported metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from hwbridge import exo
from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.devtools.broker import mosquitto
from poirotd.devtools.process import DaemonProcess

# The session cortex.yaml's MQTT input files the exoskeleton's samples under.
SESSION_ID = "cortex-demo-1"
# Sensor-X of the POIROT paper: the proprioception sensor reads 4 points low (2/8 for 6/8).
SENSOR_X = exo.FaultSpec(signal="proprioception_score", kind="offset", magnitude=-4)
_KINDS = {
    "agent": pb.MESSAGE_KIND_AGENT,
    "human": pb.MESSAGE_KIND_HUMAN,
    "tool": pb.MESSAGE_KIND_TOOL,
    "system": pb.MESSAGE_KIND_SYSTEM,
}
_NOTICE = (
    "[bold yellow]About the answers:[/] this demo runs the embedded SmolLM2-135M model on the CPU. "
    "It makes every phase of the pipeline run for real, with schema-valid JSON, but a 135M model "
    "cannot make the attribution meaningful. Real attribution needs a capable model served by "
    "vLLM: see docs/operating/vllm.md, 'Pointing poirotd at vLLM'."
)

console = Console()


def demo_file(name: str) -> Path:
    return Path(str(resources.files("poirotd.demo").joinpath(name)))


def session_requests(
    session_file: Path, session_id: str, system: str, *, end: bool = True
) -> Iterator[pb.IngestRequest]:
    """The demo session as ingest requests: start, every message in order, then (with `end`)
    its end."""
    yield pb.IngestRequest(session_start=pb.SessionStart(session_id=session_id, system=system))
    for line in session_file.read_text().splitlines():
        if not line.strip():
            continue
        m = json.loads(line)
        yield pb.IngestRequest(
            agent_message=pb.AgentMessage(
                session_id=session_id,
                index=m["index"],
                kind=_KINDS[m["kind"]],
                sender=m["sender"],
                recipient=m.get("recipient", ""),
                content=m.get("content", ""),
                tool_calls=m.get("tool_calls", []),
                tool_name=m.get("tool_name", ""),
            )
        )
    if end:
        yield pb.IngestRequest(session_end=pb.SessionEnd(session_id=session_id))


def describe_event(event: pb.InvestigationEvent) -> str:
    which = event.WhichOneof("event")
    if which == "started":
        return f"investigation started ({event.started.reason})"
    if which == "phase_begun":
        return f"[cyan]phase {event.phase_begun.phase}[/] begun"
    if which == "phase_ended":
        return (
            f"[cyan]phase {event.phase_ended.phase}[/] ended in {event.phase_ended.seconds:.1f} s"
        )
    if which == "vote_cast":
        v = event.vote_cast.vote
        if v.abstention_reason:
            return f"[magenta]{v.agent_id}[/] abstained: {v.abstention_reason}"
        forced = f" (forced: {v.forced_by})" if v.forced else ""
        return f"[magenta]{v.agent_id}[/] voted {list(v.location)}{forced}, weight {v.weight:.4f}"
    if which == "attribution_ready":
        return "[green]attribution ready[/]"
    if which == "failed":
        return f"[red]failed[/]: {event.failed.reason}"
    return f"[red]interrupted[/]: {event.interrupted.reason}"


def model_time_line(timed: pb.ModelTime) -> str:
    """Wall time against the model-time floor (on the embedded backend, every call end to end)
    and the critical path of dependent calls (what a server running the agents side by side
    would be held to)."""
    ratio = timed.wall_seconds / timed.floor_seconds if timed.floor_seconds else float("nan")
    return (
        f"wall {timed.wall_seconds:.1f} s, model busy {timed.busy_seconds:.1f} s, "
        f"floor {timed.floor_seconds:.1f} s (wall/floor {ratio:.2f}); critical path "
        f"{timed.critical_path_seconds:.1f} s: "
        f"{timed.critical_path_calls} calls, {timed.critical_path_prompt_tokens} prompt tokens "
        f"at {timed.prefill_tokens_per_second:.0f} tok/s, "
        f"{timed.critical_path_completion_tokens} generated at "
        f"{timed.decode_tokens_per_second:.1f} tok/s, {timed.per_call_seconds:.1f} s a call"
    )


def attribution_table(investigation: pb.Investigation) -> Table:
    a = investigation.attribution
    table = Table(title=f"Attribution ({a.rule}, beta={a.beta})")
    for column in ("#", "region", "type", "score", ""):
        table.add_column(column)
    for i, (region, score) in enumerate(
        zip(investigation.hazard_space.regions, a.scores, strict=True)
    ):
        mark = "TOP (tie)" if i in a.top and a.tie else ("TOP" if i in a.top else "")
        table.add_row(str(i), f"{region.name} ({region.id})", region.type, f"{score:.4f}", mark)
    return table


def _spec_file(folder: Path, broker_port: int) -> Path:
    """cortex.yaml with its MQTT input pointed at the demo's broker."""
    spec = yaml.safe_load(demo_file("cortex.yaml").read_text())
    spec["inputs"]["mqtt"]["broker"]["port"] = broker_port
    path = folder / "cortex.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


async def _publish_gait(broker_port: int) -> int:
    """One second of simulated gait with Sensor-X, as the exoskeleton would publish it."""
    simulator = exo.ExoSimulator(exo.ExoSimConfig(rate_hz=1500, faults=(SENSOR_X,), seed=4))
    messages = exo.messages(simulator.advance(1.0), "p7")
    async with MqttPublisher(BrokerConfig(port=broker_port, client_id="exoskeleton")) as publisher:
        for topic, payload in messages:
            await publisher.publish(topic, payload)
    return len(messages)


async def _first_investigation(client: PoirotClient, timeout_s: float = 60.0) -> str:
    """The id of the first investigation the daemon opened (Watch without an id replays every
    investigation's events from the first)."""
    try:
        async with asyncio.timeout(timeout_s):
            async with contextlib.aclosing(client.watch()) as events:
                async for event in events:
                    return event.investigation_id
    except TimeoutError:
        pass
    raise RuntimeError(f"no rule opened an investigation within {timeout_s:g} s")


async def _investigate(daemon: DaemonProcess, system: str, broker_port: int) -> pb.Investigation:
    async with PoirotClient(daemon.grpc_target) as client:
        requests = list(
            session_requests(demo_file("cortex_session.jsonl"), SESSION_ID, system, end=False)
        )
        durable = await client.send(requests)
        console.print(f"streamed {len(requests)} items over gRPC; durable up to seq {durable}")
        published = await _publish_gait(broker_port)
        console.print(f"published {published} MQTT messages of exoskeleton telemetry (Sensor-X)")
        investigation_id = await _first_investigation(client)
        console.print(f"a rule opened investigation {investigation_id}")
        async for event in client.watch(investigation_id):
            console.print("  " + describe_event(event))
        return await client.get(investigation_id)


def _poirot_metric_lines(url: str) -> list[str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    names = {f.name for f in text_string_to_metric_families(text)}  # parses, or raises
    shown = [
        line
        for line in text.splitlines()
        if line.startswith("poirot_") and not any(s in line for s in ("_bucket{", "_created{"))
    ]
    return [*shown, f"({len(names)} families; histogram buckets and _created series not shown)"]


@contextlib.contextmanager
def demo_daemon(folder: Path) -> Iterator[tuple[DaemonProcess, int]]:
    """A local Mosquitto and a daemon process reading it with the CORTEX spec, both stopped on
    the way out: the demo's set-up, which bench.demo times as well."""
    with mosquitto() as broker_port:
        console.print(f"local Mosquitto on port {broker_port}")
        daemon = DaemonProcess(_spec_file(folder, broker_port), folder)
        console.print("starting poirotd (embedded model)...")
        daemon.start()
        try:
            console.print(f"daemon ready: gRPC {daemon.grpc_target}, metrics {daemon.metrics_url}")
            yield daemon, broker_port
        except BaseException:
            console.print(daemon.log_tail())
            daemon.kill()
            raise
        code = daemon.terminate()
        console.print(f"daemon stopped (exit code {code})")
        if code != 0:
            raise RuntimeError(f"the daemon exited with code {code}")


def investigate(daemon: DaemonProcess, broker_port: int) -> pb.Investigation:
    """Streams the demo session, publishes the faulty gait and follows the investigation the
    rule opens to its end."""
    return asyncio.run(_investigate(daemon, "cortex", broker_port))


def run_demo(workdir: Path | None) -> int:
    console.print(_NOTICE)
    if shutil.which("mosquitto") is None:
        console.print(
            "[red]the demo needs the `mosquitto` broker:[/] `make demo` installs it "
            "(Debian package `mosquitto`)"
        )
        return 1
    with tempfile.TemporaryDirectory(prefix="poirotd-demo-") as tmp:
        folder = workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with demo_daemon(folder) as (daemon, broker_port):
                investigation = investigate(daemon, broker_port)
                _show(investigation, daemon.metrics_url)
        except RuntimeError as exc:
            console.print(f"[red]{exc}[/]")
            return 1
        return 0 if investigation.state == pb.INVESTIGATION_STATE_SUCCEEDED else 1


def _show(investigation: pb.Investigation, metrics_url: str) -> None:
    """The attribution (or why there is none), its cost and the exported metrics."""
    if investigation.state == pb.INVESTIGATION_STATE_SUCCEEDED:
        console.print(attribution_table(investigation))
    else:
        state = pb.InvestigationState.Name(investigation.state)
        console.print(f"[red]investigation ended {state}:[/] {investigation.error}")
    console.print(
        f"LLM calls {investigation.llm_calls}, "
        f"prompt tokens {investigation.prompt_tokens}, "
        f"completion tokens {investigation.completion_tokens}"
    )
    if investigation.HasField("model_time"):
        console.print(model_time_line(investigation.model_time))
    console.print("[bold]poirot_ metrics:[/]")
    for line in _poirot_metric_lines(metrics_url):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
