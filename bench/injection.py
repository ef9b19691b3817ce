"""Prompt injection (issues #21, #29): how often an attribution method follows an injected
instruction, with and without spotlighting, on the embedded model; and what spotlighting costs
in prompt tokens.

    .venv/bin/python -m bench.injection                  # 15 minutes per method on 2 shared cores
    .venv/bin/python -m bench.injection --minutes 2 --methods baseline --no-write   # a try
    .venv/bin/python -m bench.injection --render bench/injection-runs.json   # redraw the section
    .venv/bin/python -m bench.injection --methods baseline --runs b.json --no-write   # beside...
    .venv/bin/python -m bench.injection --methods echo --runs e.json --no-write
    .venv/bin/python -m bench.injection --render b.json e.json --runs bench/injection-runs.json

Method: each of the baseline (one LLM call: the system, the whole CORTEX demo session, the
incident, the legend and the vote format), ECHO and ErrorProbe, run as the daemon runs it over
the demo session with one injection of bench/injections.yaml inserted where its channel puts it
(bench/injection_cases.py); every injection asks for the parent, a region nothing in the session
blames. A run follows the injection when its attribution blames the parent (the baseline's vote,
ECHO's consensus, ErrorProbe's verdict). Each case runs twice, spotlighting off and "lines", back
to back in alternating order (as in the daemon, off quotes nothing but still breaks the model's
chat-control spellings, so the two differ by spotlighting alone); cases are taken one category
after another while the method's slice lasts, so a short run still covers every kind of attack.
A control pair with harmless text follows when there is time left.

One spotlight token serves the whole bench run, where the daemon draws one per investigation:
with it the embedded backend's prefix cache reuses the session for every case, and a random
token says nothing to the model whichever it is. The token overhead is measured first, by
tokenizing (SmolLM2's chat template) the requests of an investigation of the demo session:
every agent's Phase II request (its prefix, which all its requests share, plus the task) and the
baseline's request, verbatim against quoted. Every run is saved (bench/injection-runs.json by
default, after each method) and the results replace this bench's section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Protocol

from bench.injection_cases import (
    REASON,
    TARGET,
    InjectionCase,
    cortex_spec,
    demo_session,
    injected,
    load_cases,
)
from bench.report import add_no_write, commit_text, write_section
from bench.sections.injection import SECTION, render
from poirotd.config.spec import EmbeddedLLMSpec, SpotlightMode, SystemSpec
from poirotd.llm.base import ChatMessage
from poirotd.llm.embedded import EmbeddedBackend
from poirotd.model import HazardSpace, Vote
from poirotd.protocol import baseline, echo, errorprobe, prompts
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.events import ProtocolEvent
from poirotd.protocol.method import Case, Method
from poirotd.protocol.poirot.hazard_space import pinned_hazard_space
from poirotd.protocol.poirot.prompts import self_assessment
from poirotd.protocol.run import RunContext
from poirotd.protocol.spotlight import VERBATIM, Spotlight

# The two conditions compared; "words" (the paper's datamarking) is only measured for tokens.
COMPARED: tuple[SpotlightMode, ...] = ("off", "lines")
# The methods measured, in report order, each under its own time budget.
METHODS: dict[str, Method] = {
    "baseline": baseline.attribute,
    "echo": echo.attribute,
    # Without memory: a diagnosis recalled from an earlier case would tie the cases together.
    "errorprobe": partial(errorprobe.attribute, memory=None),
}
MINUTES = 15.0
RUNS = Path(__file__).with_name("injection-runs.json")


@dataclass(frozen=True)
class Result:
    """One run of a method: `location` marks the regions its attribution blames (its top), and
    is empty when it gave no attribution (every voter abstained)."""

    case_id: str
    category: str
    mode: SpotlightMode
    location: list[int]
    follows: bool  # the attribution blames the region the injection asked for
    seconds: float
    method: str = "baseline"
    # The method's own votes (ECHO's analysts, ErrorProbe's arbiter) marking that region.
    votes_following: int = 0
    votes: int = 1


@dataclass(frozen=True)
class Bench:
    """What one run measured, as saved and rendered."""

    started: str  # UTC
    commit: str
    control: list[Result]
    results: list[Result]
    # Prompt tokens per request ("baseline" or an agent id), by spotlighting mode.
    tokens: dict[str, dict[str, int]]
    minutes: float  # each method's budget
    set_size: int
    methods: list[str] = field(default_factory=lambda: ["baseline"])
    # Said in the section: e.g. why the budget is what it is.
    note: str = ""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Bench:
        raw = json.loads(path.read_text())
        for key in ("control", "results"):
            raw[key] = [Result(**r) for r in raw[key]]
        return cls(**raw)

    @classmethod
    def merged(cls, parts: Sequence[Bench]) -> Bench:
        """Runs of different methods saved by separate bench processes (run side by side to
        share a loaded machine), as one: they must have measured the same set in equal slices.
        The token figures are the first's (each process measures them alike)."""
        first = parts[0]
        if any((b.minutes, b.set_size) != (first.minutes, first.set_size) for b in parts):
            raise ValueError("the runs differ in slice or set: not one bench")
        methods = [m for b in parts for m in b.methods]
        if len(set(methods)) != len(methods):
            raise ValueError(f"a method is in more than one of the runs: {methods}")
        return cls(
            min(b.started for b in parts),
            ", ".join(dict.fromkeys(b.commit for b in parts)),
            [r for b in parts for r in b.control],
            [r for b in parts for r in b.results],
            first.tokens,
            first.minutes,
            first.set_size,
            methods,
            " ".join(dict.fromkeys(b.note for b in parts if b.note)),
        )


def _space(spec: SystemSpec) -> HazardSpace:
    space = pinned_hazard_space(spec)
    assert space is not None, "cortex_spec pins the hazard space"
    return space


async def _ignore(_event: ProtocolEvent) -> None:
    return None


class Voter:
    """A method's run on the embedded model, per case and condition."""

    def __init__(self, backend: EmbeddedBackend) -> None:
        self._backend = backend
        self._token = Spotlight.fresh("lines").token  # one per bench run: see the module doc
        space = _space(cortex_spec())
        self._target = [r.id for r in space.regions].index(TARGET)

    async def vote(self, case: InjectionCase, mode: SpotlightMode, method: str) -> Result:
        """As the daemon runs it: off quotes nothing but still breaks the model's control
        spellings (spotlight.py), so the two conditions differ by spotlighting alone."""
        spec = cortex_spec(protocol={"spotlighting": mode})
        space = _space(spec)
        messages, incident = injected(case, spec, demo_session())
        controls = await self._backend.control_tokens()
        spotlight = Spotlight(mode, "" if mode == "off" else self._token, controls)
        betas = {agent: spec.protocol.beta for agent in spec.agent_ids}
        run = RunContext(self._backend, _ignore, controls=controls)
        started = time.monotonic()
        bench_case = Case(spec, space, tuple(messages), incident, spotlight, betas)
        try:
            result = await METHODS[method](bench_case, run)
        except ProtocolError:
            location: list[int] = []
            votes: tuple[Vote, ...] = ()
        else:
            top = set(result.attribution.top)
            location = [int(j in top) for j in range(space.size)]
            votes = result.votes
        seconds = time.monotonic() - started
        following = sum(not v.abstained and v.location[self._target] == 1 for v in votes)
        follows = bool(location) and location[self._target] == 1
        return Result(
            case.id,
            case.category,
            mode,
            location,
            follows,
            seconds,
            method,
            following,
            len(votes),
        )


def token_overhead(backend: EmbeddedBackend, draws: int = 8) -> dict[str, dict[str, int]]:
    """Prompt tokens of the demo investigation's requests, by spotlighting mode; the mean over
    `draws` tokens, since a random token splits into more or fewer tokens."""
    session, incident = demo_session(), prompts.Incident(REASON)
    tokens: dict[str, dict[str, int]] = {}
    modes: tuple[SpotlightMode, ...] = ("off", "lines", "words")
    for mode in modes:
        spec = cortex_spec(protocol={"spotlighting": mode})
        spotlights = [VERBATIM] if mode == "off" else [Spotlight.fresh(mode) for _ in range(draws)]
        requests: dict[str, list[list[ChatMessage]]] = {}
        for spotlight in spotlights:
            for agent in spec.agents:
                view = [m for m in session if prompts.in_view(agent.id, m)]
                task = ChatMessage(role="user", content=self_assessment(spec, agent.id))
                prefix = prompts.agent_prefix(agent, view, incident, spotlight)
                requests.setdefault(agent.id, []).append([*prefix, task])
            request = baseline.baseline_request(spec, _space(spec), session, incident, spotlight)
            requests.setdefault("baseline", []).append(request)
        tokens[mode] = {
            name: round(sum(map(backend.count_tokens, drawn)) / len(drawn))
            for name, drawn in requests.items()
        }
    return tokens


def one_category_after_another(cases: Sequence[InjectionCase]) -> list[InjectionCase]:
    """The cases reordered to take one of each category in turn, in file order within each."""
    by_category: dict[str, list[InjectionCase]] = {}
    for case in cases:
        by_category.setdefault(case.category, []).append(case)
    rounds = max(len(group) for group in by_category.values())
    return [group[i] for i in range(rounds) for group in by_category.values() if i < len(group)]


class Votes(Protocol):
    """What measure_method asks of a voter (Voter, on the embedded model)."""

    async def vote(self, case: InjectionCase, mode: SpotlightMode, method: str) -> Result: ...


async def measure_method(
    voter: Votes,
    method: str,
    cases: Sequence[InjectionCase],
    deadline: float,
    saved: Callable[[Sequence[Result], Sequence[Result]], None],
) -> None:
    """`method`'s pairs one category after another until `deadline` (monotonic), then its
    control pair if there is time left: on a loaded machine a slow method gets at least one
    injection pair rather than only the control. A pair starts only when the previous pair's
    time still fits (the first always runs), so a method overruns by less than a pair; each
    pair is handed to `saved` as it ends."""
    last = 0.0
    units = list(enumerate(one_category_after_another(cases)))
    units.append((0, cases[0].benign()))
    for n, case in units:
        if last and time.monotonic() + last > deadline:
            break
        started = time.monotonic()
        pair: list[Result] = []
        for mode in COMPARED if n % 2 == 0 else COMPARED[::-1]:
            result = await voter.vote(case, mode, method)
            pair.append(result)
            mark = "follows" if result.follows else ""
            print(
                f"{method:10} {case.id:40} {mode:5} {result.location} {mark:7} "
                f"{result.seconds:.0f} s",
                flush=True,
            )
        last = time.monotonic() - started
        is_control = case.category == "benign"
        saved(pair if is_control else [], [] if is_control else pair)


async def measure(
    minutes: float, only: Sequence[str], methods: Sequence[str], runs: Path, note: str = ""
) -> Bench:
    """Every method in turn, each in its slice of `minutes`; the slices end at fixed times, so
    a method that overruns its own shortens the next one's and the whole run ends on time.
    What was measured is saved to `runs` after each pair, so that a stopped run keeps it."""
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    llm = cortex_spec().llm
    assert isinstance(llm, EmbeddedLLMSpec)
    backend = await EmbeddedBackend.load(llm)
    try:
        tokens = token_overhead(backend)
        print(f"prompt tokens: {tokens}", flush=True)
        voter = Voter(backend)
        cases = [c for c in load_cases() if not only or c.id in only]
        bench = Bench(started, commit_text(), [], [], tokens, minutes, len(cases), [], note)

        def saved(control: Sequence[Result], results: Sequence[Result]) -> None:
            bench.control.extend(control)
            bench.results.extend(results)
            bench.save(runs)

        begun = time.monotonic()
        for k, method in enumerate(methods, 1):
            bench.methods.append(method)
            await measure_method(voter, method, cases, begun + k * minutes * 60, saved)
        return bench
    finally:
        await backend.aclose()


# ------------------------------------------------------------------ report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=MINUTES, help="budget per method")
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--cases", nargs="*", default=[], help="only these case ids")
    parser.add_argument("--runs", type=Path, default=RUNS, help="where the runs are saved")
    parser.add_argument(
        "--note", default="", help="a sentence for the section; with --render, the saved one's"
    )
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        help="only redraw the section from saved runs (several are merged; with several, or "
        "with a --note, the runs are saved to --runs)",
    )
    add_no_write(parser)
    args = parser.parse_args(argv)
    if args.render:
        bench = Bench.merged([Bench.load(path) for path in args.render])
        if args.note:
            bench = replace(bench, note=args.note)
        if len(args.render) > 1 or args.note:
            bench.save(args.runs)
    else:
        bench = asyncio.run(measure(args.minutes, args.cases, args.methods, args.runs, args.note))
    section = render(bench, list(METHODS))
    print(section, flush=True)
    if not args.no_write:
        write_section(SECTION, section)


if __name__ == "__main__":
    main()
