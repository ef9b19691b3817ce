"""Time to attribution (issue #3): poirotd against poirot-framework 0.2.0's full mode (C3).

    .venv/bin/python -m bench.tta --data DIR       # the fixed cases, about an hour on 2 cores
    .venv/bin/python -m bench.tta --data DIR --cases 38 --no-write    # one case, to try the set-up

DIR is the data folder `poirotd eval --data-dir` reads (POIROTD_EVAL_DATA when --data is not
given): the cases come from its whowhen/Algorithm-Generated (docs/evaluation.md says where to
get it).

Both sides investigate the same Who&When Algorithm-Generated cases against one llama.cpp server
(`python -m llama_cpp.server`, the embedded SmolLM2-135M, one slot: that server serves one request
at a time), with the same per-call token limit and the same hazard space, pinned, so that Phase
I/0 does not decide the comparison. The library runs in a venv of its own (created here when
missing), driven by bench/tta_library.py. A reverse proxy between each client and the server
records every call identically for both sides; the server's own log says how many prompt tokens
each call actually evaluated (the rest came from its prompt cache). Each run gets a fresh server,
so neither side inherits the other's cache; the sides alternate case by case so that the shared
machine's noise hits both alike. The results replace this bench's section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Literal

from bench.report import REPORT, add_no_write, commit_text, write_section
from bench.sections.tta import SECTION, render
from poirotd.config.spec import OpenAILLMSpec, SystemSpec
from poirotd.devtools.process import free_port
from poirotd.llm.embedded import default_model_path
from poirotd.llm.openai_http import OpenAIBackend
from poirotd.model import AgentMessage, HazardRegion, HazardSpace, MessageKind
from poirotd.protocol.engine import InvestigationEngine
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.events import ProtocolEvent
from poirotd.protocol.poirot.hazard_space import agent_region
from poirotd.protocol.prompts import Incident

ROOT = Path(__file__).resolve().parents[1]
CASES_FOLDER = Path("whowhen") / "Algorithm-Generated"
LIBRARY = "poirot-framework==0.2.0"
LIBRARY_VENV = ROOT / ".venv-bench-lib"
LIBRARY_DRIVER = Path(__file__).with_name("tta_library.py")
# The five Who&When Algorithm-Generated cases with 2+ agents whose sessions cost least to read
# (summed over the agents: system prompt plus history), smallest first; every prompt of either
# side fits the 8k context with room to answer. Three have the code executor as a component.
CASES = ("12", "93", "65", "53", "38")
CONTEXT_TOKENS = 8192
# One limit for every call of both sides: poirotd's default for turns and votes (its reports get
# 768 by default); the library has no limit of its own for most calls.
MAX_TOKENS = 512
MODEL = "smollm2-135m"
# What both sides are told about why the investigation was opened.
INCIDENT = "Manual trigger: the system's final answer to its task is suspected to be wrong."
RUN_TIMEOUT_S = 1800.0
SERVER_START_TIMEOUT_S = 120.0

Side = Literal["poirotd", "library"]
SIDES: tuple[Side, Side] = ("poirotd", "library")


# ------------------------------------------------------------------ Who&When case → both inputs


@dataclass(frozen=True)
class Party:
    id: str
    name: str
    text: str  # an agent's system prompt, a component's description


@dataclass(frozen=True)
class LibraryMessage:
    """One message as one agent's LangChain history holds it."""

    own: bool
    sender: str
    content: str


@dataclass(frozen=True)
class Case:
    case_id: str
    question: str
    agents: tuple[Party, ...]
    components: tuple[Party, ...]
    messages: tuple[AgentMessage, ...]
    truth: str  # the mistake agent's id
    # Per agent id, its history for the library's LangChain adapter.
    histories: dict[str, tuple[LibraryMessage, ...]]

    @property
    def system_name(self) -> str:
        return f"whowhen_{self.case_id}"

    @property
    def description(self) -> str:
        names = ", ".join(a.name for a in self.agents)
        return f"An AutoGen group chat of agents ({names}) that solves this task: {self.question}"


def party_id(name: str) -> str:
    """A speaker's name as a spec identifier: ^[a-z][a-z0-9_]{0,63}$."""
    ident = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "party"
    if not ident[0].isalpha():
        ident = "p_" + ident
    return ident[:64]


def load_case(path: Path) -> Case:
    """A Who&When case: agents are the system_prompt entries that speak in the history; every
    other speaker (the code executor, mostly) is a component. The group chat is broadcast, so
    poirotd's messages have no recipient. The library's adapter needs a history per agent and
    counts a message once per (sender, recipient): each message goes to the next agent to speak
    (the previous one at the end), so the session is not duplicated in its prompts."""
    data = json.loads(path.read_text())
    history = data["history"]
    speakers = [m.get("name") or m["role"] for m in history]
    agents = tuple(
        Party(party_id(name), name, prompt)
        for name, prompt in data["system_prompt"].items()
        if name in speakers
    )
    agent_ids = {a.name: a.id for a in agents}
    others = sorted({s for s in speakers if s not in agent_ids})
    components = tuple(
        Party(
            party_id(name),
            name,
            f"{name}: speaks in the group chat without being an agent "
            "(it runs the code the agents write and returns its output).",
        )
        for name in others
    )
    ids = agent_ids | {c.name: c.id for c in components}
    at = datetime(2026, 1, 1, tzinfo=UTC)
    messages = tuple(
        AgentMessage(
            session_id=path.stem,
            index=i,
            kind=MessageKind.AGENT if speaker in agent_ids else MessageKind.TOOL,
            sender=ids[speaker],
            content=m["content"],
            sent_at=at + timedelta(seconds=i),
        )
        for i, (speaker, m) in enumerate(zip(speakers, history, strict=True))
    )
    histories: dict[str, list[LibraryMessage]] = {a.id: [] for a in agents}
    for i, (speaker, m) in enumerate(zip(speakers, history, strict=True)):
        recipient = _recipient(speakers, i, agent_ids)
        if speaker in agent_ids:
            histories[agent_ids[speaker]].append(LibraryMessage(True, ids[speaker], m["content"]))
        if recipient is not None:
            histories[recipient].append(LibraryMessage(False, ids[speaker], m["content"]))
    return Case(
        case_id=path.stem,
        question=data["question"],
        agents=agents,
        components=components,
        messages=messages,
        truth=party_id(data["mistake_agent"]),
        histories={k: tuple(v) for k, v in histories.items()},
    )


def _recipient(speakers: Sequence[str], i: int, agent_ids: dict[str, str]) -> str | None:
    """The agent that receives message i: the next other agent to speak, else the last one."""
    later = [s for s in speakers[i + 1 :] if s in agent_ids and s != speakers[i]]
    earlier = [s for s in speakers[:i] if s in agent_ids and s != speakers[i]]
    chosen = later[:1] or earlier[-1:]
    return agent_ids[chosen[0]] if chosen else None


def hazard_regions(case: Case) -> tuple[HazardRegion, ...]:
    """The space poirotd falls back to when its Phase I gives no valid answer (which the 135M
    model never does): the agents, then the declared components. Pinned for both sides."""
    regions = [agent_region(a.id, a.name) for a in case.agents]
    regions += [
        HazardRegion(id=c.id, name=c.name, type="software", description=c.text)
        for c in case.components
    ]
    return tuple(regions)


@dataclass(frozen=True)
class Server:
    """Where both sides' calls go: the embedded model in a fresh llama.cpp server per run (no
    `url`), or an OpenAI-compatible server already running (`make bench-gpu`'s vLLM)."""

    url: str | None = None
    model: str = MODEL
    context_tokens: int = CONTEXT_TOKENS

    def describe(self) -> str:
        if self.url is None:
            return (
                "llama-cpp-python's server with SmolLM2-135M-Instruct (Q4_1), 8k context, "
                "1 thread, one slot"
            )
        return f"the server at {self.url} serving {self.model}, {self.context_tokens} context"


EMBEDDED = Server()


def poirotd_spec(
    case: Case, base_url: str, max_tokens: int, server: Server = EMBEDDED
) -> SystemSpec:
    limits = ("report", "turn", "answer", "hazard_space")
    return SystemSpec.model_validate(
        {
            "system": {"name": case.system_name, "description": case.description},
            "agents": [{"id": a.id, "name": a.name, "system_prompt": a.text} for a in case.agents],
            "components": [
                {"id": c.id, "name": c.name, "type": "software", "description": c.text}
                for c in case.components
            ],
            "llm": {
                "backend": "openai",
                "base_urls": [base_url],
                "model": server.model,
                "context_tokens": server.context_tokens,
                "structured_output": "json_object",
                "timeout_seconds": RUN_TIMEOUT_S,
            },
            "protocol": {f"{name}_max_tokens": max_tokens for name in limits},
            "hazard_space": {"regions": [r.model_dump() for r in hazard_regions(case)]},
        }
    )


def library_job(
    case: Case, base_url: str, max_tokens: int, server: Server = EMBEDDED
) -> dict[str, Any]:
    """What bench/tta_library.py needs, as JSON: the agents, their histories, the error space."""
    regions = hazard_regions(case)
    return {
        "system_name": case.system_name,
        "system_description": case.description,
        "base_url": base_url,
        "model": server.model,
        "max_tokens": max_tokens,
        "error_space": {
            "system_name": case.system_name,
            "error_regions": [r.model_dump() for r in regions],
            "error_vector_example": [0] * len(regions),
        },
        "agents": [
            {
                "id": a.id,
                "name": a.name,
                "system_prompt": a.text,
                "messages": [asdict(m) for m in case.histories[a.id]],
            }
            for a in case.agents
        ],
    }


def library_vote_valid(vote: Any, size: int) -> bool:
    """The same test poirotd's vote schema applies: a 0/1 vector with one entry per region."""
    return (
        isinstance(vote, list)
        and len(vote) == size
        and all(isinstance(x, int) and not isinstance(x, bool) and x in (0, 1) for x in vote)
    )


# ------------------------------------------------------------------ server, proxy, call records


@dataclass(frozen=True)
class Call:
    max_tokens: int | None
    prompt_tokens: int
    completion_tokens: int
    # Prompt tokens the server evaluated (the rest came from its cache): llama.cpp's log line
    # for the call, or prompt tokens less usage's cached_tokens (vLLM with
    # --enable-prompt-tokens-details); None when neither said.
    evaluated: int | None
    finish_reason: str
    status: int
    seconds: float


_PROMPT_EVAL = re.compile(r"prompt eval time =.*/\s*(\d+) tokens")


class ServerLog:
    """The server's stderr, kept in a file; one 'prompt eval time' line per completion."""

    def __init__(self, stream: IO[str], path: Path) -> None:
        self._evaluated: list[int] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream, path), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str], path: Path) -> None:
        # The pipe is closed here, at the server's exit (its end of file), not left to the
        # collector.
        with stream, path.open("a", buffering=1) as out:
            for line in stream:
                out.write(line)
                found = _PROMPT_EVAL.search(line)
                if found:
                    with self._changed:
                        self._evaluated.append(int(found.group(1)))
                        self._changed.notify_all()

    def seen(self) -> int:
        with self._changed:
            return len(self._evaluated)

    def evaluated(self, index: int, timeout: float = 5.0) -> int | None:
        """The count of the index-th completion, waiting for the line to be read."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._evaluated) > index, timeout)
            return self._evaluated[index] if len(self._evaluated) > index else None


@dataclass(frozen=True)
class Upstream:
    """The server behind the proxy: host, port and the path its /v1 sits under."""

    host: str
    port: int
    prefix: str = ""

    @classmethod
    def of(cls, base_url: str) -> Upstream:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"an http:// server URL ending in /v1, not {base_url!r}")
        prefix = parts.path.rstrip("/").removesuffix("/v1")
        return cls(parts.hostname, parts.port or 80, prefix)


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: Upstream, log: ServerLog | None) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = upstream
        self.log = log
        # llama.cpp's server completes one request at a time; holding the slot here keeps its
        # log lines in step with the calls (nothing is lost: requests would queue at the server
        # anyway). A server that batches (no log read) gets its calls as they come.
        self.slot: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if log is not None else contextlib.nullcontext()
        )
        self.calls: list[Call] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def do_GET(self) -> None:
        self._forward(b"")

    def do_POST(self) -> None:
        self._forward(self.rfile.read(int(self.headers.get("Content-Length", "0"))))

    def _forward(self, body: bytes) -> None:
        proxy = self.server
        completion = self.path.rstrip("/").endswith("/chat/completions")
        with proxy.slot if completion else contextlib.nullcontext():
            seen, started = proxy.log.seen() if proxy.log else 0, time.monotonic()
            to = proxy.upstream
            upstream = http.client.HTTPConnection(to.host, to.port, timeout=RUN_TIMEOUT_S)
            try:
                headers = {"Content-Type": "application/json"}
                path = to.prefix + self.path
                upstream.request(self.command, path, body=body or None, headers=headers)
                response = upstream.getresponse()
                data, status = response.read(), response.status
            finally:
                upstream.close()
            if completion:
                proxy.calls.append(
                    _call(body, data, status, time.monotonic() - started, proxy, seen)
                )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the calls are recorded, not logged."""


def _call(body: bytes, data: bytes, status: int, seconds: float, proxy: _Proxy, seen: int) -> Call:
    request = json.loads(body)
    usage: dict[str, Any] = {}
    finish = ""
    if status == 200:
        answer = json.loads(data)
        usage = answer.get("usage") or {}
        finish = answer["choices"][0].get("finish_reason") or ""
    prompt_tokens = usage.get("prompt_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    evaluated = None
    if status == 200:
        evaluated = proxy.log.evaluated(seen) if proxy.log else None
        if evaluated is None and cached is not None:
            evaluated = prompt_tokens - cached
    return Call(
        max_tokens=request.get("max_tokens"),
        prompt_tokens=prompt_tokens,
        completion_tokens=usage.get("completion_tokens", 0),
        evaluated=evaluated,
        finish_reason=finish,
        status=status,
        seconds=seconds,
    )


@contextlib.contextmanager
def llm_server(logs: Path) -> Iterator[_Proxy]:
    """A fresh llama.cpp server (empty caches) behind a recording proxy; both stopped after."""
    port = free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(default_model_path()),
        "--n_ctx", str(CONTEXT_TOKENS),
        # One thread: with OpenMP, two threads on two cores shared with other tenants wait on
        # each other (measured here: 1.6 tokens/s generated with two, 10.7 with one).
        "--n_threads", "1",
        "--n_threads_batch", "1",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--verbose", "true",
        # Its RAM prompt cache (saved states, longest-prefix reuse); vLLM's prefix cache plays
        # this part in production.
        "--cache", "true",
        "--cache_size", str(2 << 30),
    ]  # fmt: skip
    server = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert server.stderr is not None
    log = ServerLog(server.stderr, logs / "server.log")
    try:
        with _proxy(Upstream("127.0.0.1", port), log) as proxy:
            _wait_ready(port, server)
            yield proxy
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@contextlib.contextmanager
def _proxy(upstream: Upstream, log: ServerLog | None) -> Iterator[_Proxy]:
    """The recording proxy in front of `upstream`, serving until the block ends."""
    proxy = _Proxy(upstream, log)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


@contextlib.contextmanager
def serving(server: Server, logs: Path) -> Iterator[_Proxy]:
    """The recording proxy before the server runs go to: a fresh llama.cpp server, or the
    external one (whose prefix cache then lasts across runs: the sides alternate, so it serves
    both alike)."""
    if server.url is None:
        with llm_server(logs) as proxy:
            yield proxy
    else:
        with _proxy(Upstream.of(server.url), None) as proxy:
            yield proxy


def _wait_ready(port: int, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited with {server.returncode}")
        url = f"http://127.0.0.1:{port}/v1/models"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
            return
        time.sleep(0.5)
    raise RuntimeError("llama.cpp server did not answer within the start timeout")


# ------------------------------------------------------------------ the two sides


@dataclass
class Run:
    side: Side
    case_id: str
    agents: int
    regions: int
    seconds: float = 0.0
    valid_votes: int = 0
    attributed: list[str] = field(default_factory=list)
    truth: str = ""
    error: str = ""
    calls: list[Call] = field(default_factory=list)
    # poirotd's model-time floor (the critical path of dependent calls at the speeds its calls
    # showed, ModelTime) and that path's length; 0 for the library and for a failed run.
    floor_seconds: float = 0.0
    critical_path_calls: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def evaluated(self) -> int | None:
        counts = [c.evaluated for c in self.calls if c.status == 200]
        return None if None in counts else sum(c or 0 for c in counts)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.calls)


class _NoCache:
    """Phase I's cache: never consulted, the space is pinned."""

    async def get_hazard_space(self, system: str, version: str) -> HazardSpace | None:
        return None

    async def put_hazard_space(self, space: HazardSpace) -> None:
        return None


async def _ignore(_event: ProtocolEvent) -> None:
    return None


async def run_poirotd(
    case: Case, base_url: str, max_tokens: int, run: Run, server: Server = EMBEDDED
) -> None:
    """The daemon's engine over its OpenAI backend; TTA = the whole `InvestigationEngine.run`."""
    spec = poirotd_spec(case, base_url, max_tokens, server)
    assert isinstance(spec.llm, OpenAILLMSpec)
    backend = await OpenAIBackend.open(spec.llm)
    engine = InvestigationEngine(spec, backend, _NoCache())
    started = time.monotonic()
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            outcome = await engine.run(case.messages, _ignore, incident=Incident(INCIDENT))
    except (ProtocolError, TimeoutError) as exc:
        run.error = str(exc) or "timed out"
        return
    finally:
        run.seconds = time.monotonic() - started
        await backend.aclose()
    run.valid_votes = sum(not v.abstained for v in outcome.votes)
    run.attributed = [outcome.hazard_space.regions[i].id for i in outcome.attribution.top]
    run.floor_seconds = outcome.model_time.floor_seconds
    run.critical_path_calls = outcome.model_time.critical_path_calls


def run_library(
    case: Case, base_url: str, max_tokens: int, run: Run, logs: Path, server: Server = EMBEDDED
) -> None:
    """The library in its own venv; TTA = its `run_poirot_from_agents` call, timed inside."""
    job = json.dumps(library_job(case, base_url, max_tokens, server))
    regions = hazard_regions(case)
    with (logs / f"library-{case.case_id}.log").open("w") as progress:
        started = time.monotonic()
        try:
            done = subprocess.run(
                [str(LIBRARY_VENV / "bin" / "python"), str(LIBRARY_DRIVER)],
                input=job,
                stdout=subprocess.PIPE,
                stderr=progress,
                text=True,
                timeout=RUN_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            run.seconds, run.error = time.monotonic() - started, "timed out"
            return
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        run.seconds = time.monotonic() - started
        run.error = f"driver exited with {done.returncode}; see {progress.name}"
        return
    outcome = json.loads(lines[-1])
    run.seconds = outcome["seconds"]
    run.valid_votes = sum(library_vote_valid(v, len(regions)) for v in outcome["votes"].values())
    names = {r.name: r.id for r in regions}
    top = outcome["consensus"]["faulty_component"]
    run.attributed = [names.get(name, name) for name in top.split(" / ")]


def ensure_library_venv() -> None:
    """The library and its LangChain stack live apart from the project's venv."""
    python = LIBRARY_VENV / "bin" / "python"
    probe = "import importlib.metadata as m; print(m.version('poirot-framework'))"
    if python.exists():
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if found.stdout.strip() == LIBRARY.split("==")[1]:
            return
    else:
        subprocess.run([sys.executable, "-m", "venv", str(LIBRARY_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", LIBRARY], check=True)


def investigate(
    side: Side, case: Case, max_tokens: int, logs: Path, server: Server = EMBEDDED
) -> Run:
    run = Run(side, case.case_id, len(case.agents), len(hazard_regions(case)), truth=case.truth)
    with serving(server, logs) as proxy:
        if side == "poirotd":
            asyncio.run(run_poirotd(case, proxy.base_url, max_tokens, run, server))
        else:
            run_library(case, proxy.base_url, max_tokens, run, logs, server)
        run.calls = list(proxy.calls)
    return run


# ------------------------------------------------------------------ figures and the report


@dataclass
class Sitting:
    """One invocation that added runs: when it started, the code it measured, the cases it ran
    and what the operator noted about the machine then (`--note`)."""

    started: datetime
    commit: str
    note: str = ""
    cases: list[str] | None = None  # None: saved before sittings listed their cases

    def describe(self) -> str:
        if self.cases is None:
            ran = "cases not recorded"
        else:
            ran = f"cases {', '.join(self.cases)}" if self.cases else "no case"
        note = f"; {self.note}" if self.note else ""
        return f"{self.started:%Y-%m-%d %H:%M} UTC, commit {self.commit}: {ran}{note}."


def save_runs(
    path: Path,
    sittings: Sequence[Sitting],
    max_tokens: int,
    runs: Sequence[Run],
    server: Server = EMBEDDED,
) -> None:
    record = {
        "started": sittings[0].started.isoformat(),
        "sittings": [asdict(t) | {"started": t.started.isoformat()} for t in sittings],
        "max_tokens": max_tokens,
        "server": asdict(server),
        "runs": [asdict(r) for r in runs],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)


def load_runs(path: Path) -> tuple[list[Sitting], int, list[Run], Server]:
    """What `save_runs` wrote, to re-render a report or resume a run without repeating a case.
    Files from before sittings were saved give one, its commit not recorded; files from before
    the server was saved were all run on the embedded one."""
    record = json.loads(path.read_text())
    runs = [Run(**(r | {"calls": [Call(**c) for c in r["calls"]]})) for r in record["runs"]]
    saved = record.get("sittings") or [{"started": record["started"], "commit": "not recorded"}]
    sittings = [Sitting(**(t | {"started": datetime.fromisoformat(t["started"])})) for t in saved]
    return sittings, record["max_tokens"], runs, Server(**record.get("server", {}))


def main(argv: Sequence[str] | None = None) -> None:
    # SIGTERM unwinds like Ctrl-C, so the servers started here are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument(
        "--data",
        type=Path,
        default=os.environ.get("POIROTD_EVAL_DATA"),
        help="the data folder holding whowhen/ (default: POIROTD_EVAL_DATA)",
    )
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument(
        "--server",
        help="an OpenAI-compatible server's /v1 URL to run both sides against (default: a fresh "
        "llama.cpp server with the embedded model per run)",
    )
    parser.add_argument("--model", default=MODEL, help="the model name --server serves")
    parser.add_argument("--context-tokens", type=int, default=CONTEXT_TOKENS)
    parser.add_argument(
        "--report", type=Path, help="write the section to this file instead of BENCHMARKS.md"
    )
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    add_no_write(parser)
    parser.add_argument("--render", type=Path, help="only re-render a saved runs.json")
    parser.add_argument(
        "--note", default="", help="what else the machine did meanwhile, shown with this sitting"
    )
    parser.add_argument(
        "--runs",
        type=Path,
        help="save the runs here after every case (default: in the log folder); if it exists, "
        "resume: its runs are kept and their cases not run again",
    )
    args = parser.parse_args(argv)
    report = None if args.no_write else args.report or REPORT
    if args.render:
        sittings, max_tokens, runs, server = load_runs(args.render)
        _report(sittings, max_tokens, runs, server, report)
        return
    if args.data is None:
        parser.error("--data (or POIROTD_EVAL_DATA): the data folder holding whowhen/")
    server = Server(args.server, args.model, args.context_tokens)
    if "library" in args.sides:
        ensure_library_venv()
    logs = Path(tempfile.mkdtemp(prefix="bench-tta-"))
    print(f"logs: {logs}", flush=True)
    saved = args.runs or logs / "runs.json"
    ran_cases: list[str] = []  # this sitting's, filled as it goes
    sitting = Sitting(datetime.now(UTC), commit_text(), args.note, ran_cases)
    sittings, runs = [sitting], []
    if saved.exists():
        earlier, max_tokens, runs, was = load_runs(saved)
        if max_tokens != args.max_tokens:
            parser.error(f"{saved} was run with --max-tokens {max_tokens}")
        if was != server:
            parser.error(f"{saved} was run against {was.describe()}")
        sittings = [*earlier, sitting]
    done = {(r.case_id, r.side) for r in runs}
    # The section is rewritten after every case: an interrupted run still leaves its figures.
    for case_id in args.cases:
        case = load_case(args.data / CASES_FOLDER / f"{case_id}.json")
        for side in args.sides:
            if (case_id, side) in done:
                continue
            run = investigate(side, case, args.max_tokens, logs, server)
            runs.append(run)
            if case_id not in ran_cases:
                ran_cases.append(case_id)
            print(json.dumps(asdict(run)), flush=True)
        save_runs(saved, sittings, args.max_tokens, runs, server)
        _report(sittings, args.max_tokens, runs, server, report)


def _report(
    sittings: Sequence[Sitting],
    max_tokens: int,
    runs: Sequence[Run],
    server: Server,
    report: Path | None,
) -> None:
    section = render(runs, max_tokens, sittings, RUN_TIMEOUT_S, server)
    print(section, flush=True)
    if report is not None:
        write_section(SECTION, section, report)


if __name__ == "__main__":
    main()
