"""bench.tta's section: time to attribution of poirotd and of poirot-framework per case, their
totals, what limits each side, and the sittings the runs came from."""

from __future__ import annotations

import platform
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.report import begin_marker, end_marker

if TYPE_CHECKING:
    from bench.tta import Run, Server, Sitting

SECTION = "bench.tta"


@dataclass(frozen=True)
class Totals:
    runs: int
    median_seconds: float
    calls: int
    prompt_tokens: int
    evaluated: int | None
    completion_tokens: int
    valid_votes: int
    agents: int
    correct: int
    failed: int
    max_prompt: int
    cut: int  # calls that stopped at the token limit

    @property
    def valid_share(self) -> float:
        return self.valid_votes / self.agents if self.agents else 0.0


def totals(runs: Sequence[Run]) -> Totals:
    calls = [c for r in runs for c in r.calls]
    evaluated = [r.evaluated for r in runs]
    return Totals(
        runs=len(runs),
        median_seconds=statistics.median(r.seconds for r in runs) if runs else 0.0,
        calls=len(calls),
        prompt_tokens=sum(r.prompt_tokens for r in runs),
        evaluated=None if None in evaluated else sum(e or 0 for e in evaluated),
        completion_tokens=sum(r.completion_tokens for r in runs),
        valid_votes=sum(r.valid_votes for r in runs),
        agents=sum(r.agents for r in runs),
        correct=sum(r.truth in r.attributed and not r.error for r in runs),
        failed=sum(bool(r.error) for r in runs),
        max_prompt=max((c.prompt_tokens for c in calls), default=0),
        cut=sum(c.finish_reason == "length" for c in calls),
    )


def _lower(side: Totals) -> str:
    return "≥ " if side.failed else ""


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def limits_text(ours: Totals, theirs: Totals, runs: Sequence[Run]) -> str:
    """Where the time goes, from the recorded calls, then what the call logs show."""
    lines = []
    for label, side in (("poirotd", ours), ("library", theirs)):
        calls = [c for r in runs if r.side == label for c in r.calls]
        if not calls:
            continue
        per_call = statistics.mean(c.seconds for c in calls)
        evaluated = side.evaluated or 0
        lines.append(
            f"- **{label}:** {len(calls)} calls, {per_call:.0f} s each on average, one at a time; "
            f"{evaluated / len(calls):,.0f} prompt tokens evaluated and "
            f"{side.completion_tokens / len(calls):,.0f} generated per call; {side.cut} calls "
            "stopped at the token limit."
        )
    lines += [
        "- **The machine: prompt evaluation.** On its one thread llama.cpp evaluates prompts "
        "at a few dozen tokens/s (each sitting's speeds, from its own log, are noted above), so "
        "a fresh 3k-token prompt costs one to three minutes before its first token. On both "
        "sides time to attribution is mostly prompt evaluation: the evaluated-token counts "
        "predict it better than the call counts.",
        "- **poirotd.** Every request of one agent starts with the same prefix (system prompt, "
        "session), so the server evaluates it once per agent, in the agent's Phase II report; "
        "its peer answers and votes then evaluate about 100 tokens each. What remains is the "
        "protocol's own text: the self-assessment task (~1k tokens) and the interrogation "
        "opening (~1.7k tokens, region legend and findings) are each evaluated once per agent "
        "and cost more than the session itself on these cases. They, not the model's answers, "
        "are what to shrink next. The agents run concurrently, but a one-slot server runs "
        "their calls one after another; a batching server (vLLM) would overlap them.",
        "- **The library.** Phase 1 evaluates each agent's whole prompt afresh. In Phase 2 each "
        "call appends the model's last answer and then repeats the ~2.4k-token Phase 2 "
        "instructions after it, so the cache covers only the growing history and every call "
        "evaluates those instructions again. The model answers in free text and never calls "
        "`talk_to_<peer>` (llama-cpp-python's server returned no tool call for this model's "
        "chat template) nor writes the vote JSON, so each agent loops to its 8-call limit with "
        "answers cut at the token limit, its prompt growing by ~530 tokens a call toward the 8k "
        "context, and its forced final vote came back malformed. Agents consult one after "
        f"another, so on this machine {_library_ends(runs)} Its valid-vote share above counts "
        "missing votes, and the calls and tokens of a run stopped at the time limit leave out "
        "the call in flight then.",
    ]
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="  ") for line in lines)


def _library_ends(runs: Sequence[Run]) -> str:
    """How the library's runs ended: at the time limit, or finished with what votes."""
    library = [r for r in runs if r.side == "library"]
    stopped = sum(bool(r.error) for r in library)
    text = f"{stopped} of {len(library)} runs ended at the time limit while an agent was looping."
    if finished := [r for r in library if not r.error]:
        named = ", ".join(sorted({a for r in finished for a in r.attributed})) or "nothing"
        text += (
            f" The {len(finished)} that finished had "
            f"{sum(r.valid_votes for r in finished)}/{sum(r.agents for r in finished)} valid "
            f"votes (the library pads a malformed vote into zeros) and named {named}."
        )
    return text


def floor_text(run: Run) -> str:
    """poirotd's wall time against its model-time floor, when it has one."""
    if not run.floor_seconds:
        return ""
    return (
        f" (floor {run.floor_seconds:.0f} s over {run.critical_path_calls} calls, "
        f"{run.seconds / run.floor_seconds:.2f}x)"
    )


def render(
    runs: Sequence[Run],
    max_tokens: int,
    sittings: Sequence[Sitting],
    run_timeout_s: float,
    server: Server,
) -> str:
    """The BENCHMARKS.md section: the figures, per case, then how they were measured.
    `sittings`: when each invocation that added runs started (a resumed run has several);
    `server`: what both sides' calls went to."""
    by_side = {s: [r for r in runs if r.side == s] for s in ("poirotd", "library")}
    ours, theirs = totals(by_side["poirotd"]), totals(by_side["library"])
    ratio = ours.median_seconds / theirs.median_seconds if theirs.median_seconds else 0.0
    # A run without an attribution counts with the time it ran: a lower bound of its TTA.
    bound = {(False, False): "", (False, True): "≤ ", (True, False): "≥ "}
    ratio_text = f"{bound.get((ours.failed > 0, theirs.failed > 0), '? ')}{ratio:.2f}x"
    cases = ", ".join(r.case_id for r in by_side["poirotd"])
    limits = sorted({str(c.max_tokens) for r in runs for c in r.calls})

    def row(label: str, a: str, b: str, goal: str = "") -> str:
        return f"| {label} | {a} | {b} | {goal} |"

    lines = [
        row("median time to attribution", f"**{_lower(ours)}{ours.median_seconds:.0f} s**",
            f"{_lower(theirs)}{theirs.median_seconds:.0f} s",
            f"≤ 1/3 of the library's: **{ratio_text}**"),
        row("LLM calls", f"{ours.calls}", f"{theirs.calls}"),
        row("prompt tokens sent", f"{ours.prompt_tokens:,}", f"{theirs.prompt_tokens:,}"),
        row("prompt tokens evaluated (sent minus cached)", f"**{_count(ours.evaluated)}**",
            _count(theirs.evaluated), "no more than the library's"),
        row("completion tokens", f"{ours.completion_tokens:,}", f"{theirs.completion_tokens:,}"),
        row("calls cut at the token limit", f"{ours.cut}", f"{theirs.cut}"),
        row("schema-valid votes", f"**{ours.valid_votes}/{ours.agents} "
            f"({ours.valid_share:.0%})**", f"{theirs.valid_votes}/{theirs.agents} "
            f"({theirs.valid_share:.0%})", "≥ 99%"),
        row("runs without an attribution", f"{ours.failed}", f"{theirs.failed}"),
        row("attribution = Who&When's mistake agent", f"{ours.correct}/{ours.runs}",
            f"{theirs.correct}/{theirs.runs}"),
        row("largest prompt of one call (tokens)", f"{ours.max_prompt:,}",
            f"{theirs.max_prompt:,}"),
    ]  # fmt: skip
    per_case = [
        "| case | agents / regions | side | TTA | calls | prompt sent / evaluated | completion "
        "| valid votes | attributed (truth) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in runs:
        attributed = f"none: {r.error[:60]}" if r.error else ", ".join(r.attributed)
        per_case.append(
            f"| {r.case_id} | {r.agents} / {r.regions} | {r.side} "
            f"| {'≥ ' if r.error else ''}{r.seconds:.0f} s{floor_text(r)} "
            f"| {len(r.calls)} | {r.prompt_tokens:,} / {_count(r.evaluated)} "
            f"| {r.completion_tokens:,} | {r.valid_votes}/{r.agents} | {attributed} ({r.truth}) |"
        )
    header = (
        f"{platform.machine()}, "
        f"Python {platform.python_version()}, {server.describe()}; "
        f"Who&When Algorithm-Generated cases {cases}; "
        f"per-call token limit **{max_tokens}** on both sides (limits seen in requests: "
        f"{', '.join(limits)}); runs without an attribution end at {run_timeout_s:.0f} s."
    )
    if server.url is not None:
        header += (
            " Against this server (not the embedded set-up the notes below describe): the proxy"
            " forwards calls as they come, evaluated = prompt tokens less usage's cached_tokens,"
            " and the server's prefix cache lasts across runs."
        )
    header = textwrap.fill(header, 100, break_on_hyphens=False)
    sitting_lines = "\n".join(
        textwrap.fill(f"- {s.describe()}", 100, subsequent_indent="  ", break_on_hyphens=False)
        for s in sittings
    )
    return f"""{begin_marker(SECTION)}
## Time to attribution (`python -m bench.tta`)

{header}

Sittings (a resumed run has several; each case's two sides ran back to back in one):
{sitting_lines}

| figure | poirotd | poirot-framework 0.2.0, C3 | goal |
| --- | ---: | ---: | --- |
{chr(10).join(lines)}

{chr(10).join(per_case)}

### How it is measured

- **Same inputs.** Each case becomes a poirotd system spec (agents = the `system_prompt` entries
  that speak in the history; any other speaker, the code executor, a component; the history is
  the session, broadcast) and, for the library, one LangChain agent per agent
  (`create_react_agent` over `ChatOpenAI` at the same server, the agent's system prompt, its
  history: its own messages as AI turns, each message it received as a human turn named after
  the sender) passed to `run_poirot_from_agents(provider="local", mode="C3")`.
- **Same hazard space, pinned.** Both sides vote over the space poirotd falls back to when its
  Phase I gives no valid answer: one region per agent, then the components. poirotd gets it as
  `hazard_space.regions` in the spec; the library gets it as its Phase 0 result (its own Phase 0
  fails with this model on every case tried; `run_poirot` reads a saved one from its output
  directory, `run_poirot_from_agents` cannot be given one, so the driver answers Phase 0 with
  it). Neither side spends a call on it.
- **Same limit.** Every request carries `max_tokens` = {max_tokens}: poirotd's report, turn,
  answer and vote limits are all set to it (by default reports get 768, peer answers 256). The
  library's chat models are all created with it; left alone, its Phase 2 models have none, and
  langchain-openai sends a limit as `max_completion_tokens`, a field llama-cpp-python's server
  ignores: it then generates until the context is full (the earlier ~400 s, ~10k-completion-token
  case). The driver therefore also puts `max_tokens` in each request body. The proxy records the
  `max_tokens` of every request (listed above).
- **Time to attribution.** poirotd: `InvestigationEngine.run` in this process, from its start to
  the attribution (the daemon's store and gRPC around it are not included). Library: its
  `run_poirot_from_agents` call, timed inside its driver process (not its imports).
- **Model-time floor.** Beside poirotd's TTA: the critical path of its LLM calls (the longest
  chain of calls each waiting for the one before) at the prefill and decode speeds its own calls
  showed (the record's `model_time`), and the TTA over it; the server runs one call at a time,
  so concurrent agents queue and the TTA stays above the floor by their queueing.
- **Calls and tokens.** A recording reverse proxy sits between each client and the server and
  takes prompt and completion tokens from each response's `usage`. The server does not report
  cached tokens (`prompt_tokens_details` is absent), so "evaluated" is what llama.cpp's own
  `prompt eval time ... / N tokens` log line says for that call; the proxy forwards one request
  at a time (the server runs one anyway) so each line belongs to one call. The server runs with
  its RAM prompt cache (`--cache`), which both sides may use, and is restarted for every run so
  neither side starts with the other's cache.
- **Schema-valid votes.** poirotd: votes that passed its vote schema (not abstentions, repairs
  allowed). Library: final votes whose `location` is a 0/1 vector with one entry per region, the
  same test.
- **Order and machine.** Cases alternate sides (poirotd, library, next case...) on a shared
  2-core machine; what else ran meanwhile is noted with each sitting. The server runs llama.cpp on
  one thread: with two, its OpenMP threads wait on each other whenever another tenant holds a core
  (measured: 1.6 tokens/s generated with two threads, 10.7 with one).

### What limits it

{limits_text(ours, theirs, runs)}

{end_marker(SECTION)}"""
