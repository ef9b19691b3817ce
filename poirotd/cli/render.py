"""How the operator's commands show the daemon's answers in a terminal (rich).

Everything the monitored system or a model wrote (messages, reasons, justifications, reports,
prompts and answers) is untrusted: it is shown as plain text, never as rich markup, with control
and invisible characters written out (<U+001B>), so it can neither restyle the output nor send
escape sequences to the operator's terminal.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence

from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from poirotd.api.poirot.v1 import poirot_pb2 as pb

BAR_WIDTH = 24
_REASON_CHARS = 60
# Characters other than printable ASCII, newline and tab; of those, the ones written out.
_NOT_PLAIN = re.compile(r"[^\n\t\x20-\x7e]")
# What a state that has not finished means for the one waiting on it.
_WAITING = {
    pb.INVESTIGATION_STATE_DEFERRED: "a hazard rule's investigation that found the queue full:"
    " kept, and queued as soon as the queue has room",
    pb.INVESTIGATION_STATE_QUEUED: "waiting for a worker",
    pb.INVESTIGATION_STATE_RUNNING: "running",
    pb.INVESTIGATION_STATE_INTERRUPTED: "the daemon stopped before it finished;"
    " its partial record is kept",
}


def _written_out(found: re.Match[str]) -> str:
    ch = found.group()
    return f"<U+{ord(ch):04X}>" if unicodedata.category(ch).startswith("C") else ch


def plain(text: str, style: str = "") -> Text:
    """Untrusted text as it is, markup and all, its control and invisible characters written
    out."""
    return Text(_NOT_PLAIN.sub(_written_out, text), style=style)


def _json(text: str) -> Text:
    """JSON the daemon stored from a model's answer, indented, as untrusted text."""
    return plain(json.dumps(json.loads(text), indent=2, ensure_ascii=False))


def state_name(state: int) -> str:
    return pb.InvestigationState.Name(state).removeprefix("INVESTIGATION_STATE_")  # type: ignore[arg-type]


def when(ts: Timestamp) -> str:
    """A timestamp in UTC to the second, "-" when unset."""
    if ts.seconds == 0 and ts.nanos == 0:
        return "-"
    return ts.ToDatetime().strftime("%Y-%m-%d %H:%M:%SZ")


def _kind_name(kind: int) -> str:
    return pb.MessageKind.Name(kind).removeprefix("MESSAGE_KIND_").lower()  # type: ignore[arg-type]


def _region_ids(inv: pb.Investigation) -> list[str]:
    return [region.id for region in inv.hazard_space.regions]


def _top(inv: pb.Investigation) -> Text:
    """The top region(s) and score, "tie" when several share it."""
    a, regions = inv.attribution, _region_ids(inv)
    if not inv.HasField("attribution") or not a.top:
        return Text("-")
    names = ", ".join(regions[i] if i < len(regions) else f"#{i}" for i in a.top)
    return plain(f"{names} {a.scores[a.top[0]]:.2f}" + (" (tie)" if a.tie else ""))


# ------------------------------------------------------------ investigations


def investigations_table(investigations: Iterable[pb.Investigation]) -> Table:
    table = Table("investigation", "created", "session", "method", "state", "top", "reason")
    for inv in investigations:
        reason = (
            inv.reason if len(inv.reason) <= _REASON_CHARS else inv.reason[:_REASON_CHARS] + "…"
        )
        table.add_row(
            Text(inv.investigation_id, no_wrap=True),
            when(inv.created_at),
            plain(inv.session_id),
            plain(inv.method),
            state_name(inv.state),
            _top(inv),
            plain(reason),
        )
    return table


def investigation(inv: pb.Investigation) -> RenderableType:
    """The record as an operator reads it: what happened, the attribution and how it was voted,
    what the agents reported, and whatever made the run less than complete."""
    parts: list[RenderableType] = [_header(inv)]
    if inv.HasField("attribution"):
        parts += [Rule("attribution", align="left"), _attribution(inv)]
    if inv.votes:
        parts += [Rule("votes", align="left"), _votes(inv)]
    if inv.reports:
        parts += [Rule("Phase II reports", align="left"), *_reports(inv.reports)]
    if inv.coalesced or inv.coalesced_omitted:
        parts += [Rule("coalesced triggers", align="left"), _coalesced(inv)]
    if inv.injection_findings:
        parts += [Rule("injection findings", align="left")]
        parts += [plain(f"- {finding}") for finding in inv.injection_findings]
    if inv.context_cuts:
        parts += [Rule("context cuts", align="left"), _context_cuts(inv.context_cuts)]
    if inv.HasField("confirmed"):
        parts += [Rule("confirmed outcome", align="left"), *_outcomes(inv)]
    if inv.findings_json:
        parts += [Rule(f"{inv.method} findings", align="left"), _json(inv.findings_json)]
    return Group(*parts)


def _header(inv: pb.Investigation) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    state = Text(state_name(inv.state), style="bold")
    if inv.state in _WAITING:
        state.append(f" ({_WAITING[inv.state]})", style="")
    grid.add_row("investigation", Text(inv.investigation_id))
    grid.add_row("state", state)
    grid.add_row("method", plain(inv.method))
    grid.add_row("session", plain(inv.session_id))
    grid.add_row("created", when(inv.created_at))
    if inv.HasField("finished_at"):
        grid.add_row("finished", when(inv.finished_at))
    grid.add_row("requested by", plain(inv.requested_by or "a hazard rule"))
    grid.add_row("reason", plain(inv.reason))
    if inv.HasField("trigger"):
        t = inv.trigger
        grid.add_row("trigger", plain(f"rule {t.rule} ({t.severity}) at {when(t.at)}: {t.summary}"))
    if inv.error:
        grid.add_row("error", plain(inv.error, style="red"))
    if inv.degraded_reason:
        grid.add_row("degraded", plain(inv.degraded_reason, style="yellow"))
    if inv.HasField("attribution") and inv.attribution.HasField("step"):
        grid.add_row("step", f"the fault first shows at message #{inv.attribution.step}")
    if inv.llm_calls:
        phases = ", ".join(f"{p.phase} {p.seconds:.1f} s" for p in inv.phases)
        usage = f"{inv.llm_calls} calls, {inv.prompt_tokens} + {inv.completion_tokens} tokens"
        grid.add_row("LLM", f"{usage}; {phases}" if phases else usage)
    return grid


def bar(score: float, scale: float) -> str:
    """`score` as a bar of BAR_WIDTH cells, full at `scale`."""
    filled = round(BAR_WIDTH * min(max(score / scale, 0.0), 1.0)) if scale > 0 else 0
    return "█" * filled + "·" * (BAR_WIDTH - filled)


def _attribution(inv: pb.Investigation) -> RenderableType:
    """Each region's score as a bar against the total vote weight (a full bar: every voter named
    it), the regions the decision rule chose, and a tie said outright."""
    a = inv.attribution
    regions = list(inv.hazard_space.regions)
    total = sum(v.weight for v in inv.votes if not v.abstention_reason) or max(a.scores, default=0)
    table = Table("region", "type", "score", "", "decision", box=None, padding=(0, 1))
    for i, score in enumerate(a.scores):
        region = regions[i] if i < len(regions) else pb.HazardRegion(id=f"#{i}")
        chosen = i < len(a.decision) and a.decision[i] == 1
        table.add_row(
            plain(region.id, style="bold" if i in a.top else ""),
            plain(region.type),
            bar(score, total),
            f"{score:.2f}",
            "◆ chosen" if chosen else "",
        )
    rule = Text(f"decision rule {a.rule}, β {a.beta:g}; bars: share of the total vote weight")
    rule.append(f" {total:.2f}")
    parts: list[RenderableType] = [table, rule]
    if a.tie:
        tied = ", ".join(regions[i].id if i < len(regions) else f"#{i}" for i in a.top)
        parts.append(plain(f"tie: {tied} share the top score; reported as a tie, not broken"))
    return Group(*parts)


def _votes(inv: pb.Investigation) -> Table:
    regions = _region_ids(inv)
    table = Table("agent", "β", "weight", "position", "step", "justification")
    for v in inv.votes:
        position = ", ".join(
            regions[j] if j < len(regions) else f"#{j}" for j, x in enumerate(v.location) if x
        )
        if v.abstention_reason:
            justification = plain(f"abstained: {v.abstention_reason}", style="yellow")
        else:
            justification = plain(v.justification)
            if v.forced_by:
                justification.append(f" (forced: {v.forced_by})", style="yellow")
        table.add_row(
            plain(v.agent_id),
            f"{inv.betas[v.agent_id]:g}" if v.agent_id in inv.betas else "",
            f"{v.weight:.3f}",
            plain(position or "-"),
            str(v.step) if v.HasField("step") else "-",
            justification,
        )
    return table


def _reports(reports: Sequence[pb.AgentReport]) -> list[RenderableType]:
    parts: list[RenderableType] = []
    for report in reports:
        parts.append(plain(report.agent_id, style="bold"))
        parts.append(_json(report.report_json) if report.report_json else Text("no valid report"))
    return parts


def _coalesced(inv: pb.Investigation) -> RenderableType:
    table = Table("at", "from", "reason", "joined while", "requested by")
    for c in inv.coalesced:
        table.add_row(
            when(c.at),
            plain(f"rule {c.rule}" if c.rule else "Trigger"),
            plain(c.reason),
            state_name(c.state),
            plain(c.requested_by or "-"),
        )
    if not inv.coalesced_omitted:
        return table
    return Group(table, Text(f"and {inv.coalesced_omitted} more, not kept one by one"))


def _context_cuts(cuts: Sequence[pb.ContextCut]) -> Table:
    table = Table("agent", "message", "action", "characters")
    for c in cuts:
        table.add_row(
            plain(c.agent_id or "(baseline)"),
            f"#{c.index}",
            plain(c.action),
            f"{c.chars_before} → {c.chars_after}",
        )
    return table


def _outcomes(inv: pb.Investigation) -> list[RenderableType]:
    def line(outcome: pb.ConfirmedOutcome) -> Text:
        return plain(f"{', '.join(outcome.region_ids)} at {when(outcome.at)}: {outcome.note}")

    parts: list[RenderableType] = [line(inv.confirmed)]
    parts += [Text("superseded: ").append_text(line(old)) for old in inv.superseded]
    return parts


def transcript(exchanges: Sequence[pb.Exchange]) -> RenderableType:
    """Every LLM call of the investigation: each turn of the prompt, then the answer."""
    parts: list[RenderableType] = []
    for n, x in enumerate(exchanges, start=1):
        head = f"#{n} {x.phase} · {x.agent_id or '-'} · {x.purpose} · {when(x.at)}"
        head += f" · {x.prompt_tokens} + {x.completion_tokens} tokens · {x.seconds:.1f} s"
        parts.append(Rule(plain(head), align="left"))
        for turn in x.messages:
            parts += [plain(f"[{turn.role}]", style="bold"), plain(turn.content)]
        if x.error:
            parts += [Text("[error]", style="bold red"), plain(x.error)]
        else:
            parts += [Text("[answer]", style="bold green"), plain(x.response)]
    return Group(*parts)


# ------------------------------------------------------------ events


def event_line(e: pb.InvestigationEvent) -> Text:
    """One event as one line: its id (what a watch resumes after), time, investigation, what."""
    kind = e.WhichOneof("event") or "unknown"
    line = Text(f"#{e.event_id} {when(e.at)} {e.investigation_id} ")
    line.append(kind, style="bold")
    line.append_text(plain(f" {_event_detail(e)}".rstrip()))
    return line


def _event_detail(e: pb.InvestigationEvent) -> str:
    which = e.WhichOneof("event")
    if which == "started":
        return f"session {e.started.session_id}: {e.started.reason}"
    if which == "phase_begun":
        return e.phase_begun.phase
    if which == "phase_ended":
        return f"{e.phase_ended.phase} ({e.phase_ended.seconds:.1f} s)"
    if which == "vote_cast":
        v = e.vote_cast.vote
        if v.abstention_reason:
            return f"{v.agent_id} abstained: {v.abstention_reason}"
        vector = "".join(str(bit) for bit in v.location)
        return f"{v.agent_id} voted {vector} (weight {v.weight:.3f})"
    if which == "attribution_ready":
        ready = e.attribution_ready
        a, ids = ready.attribution, list(ready.region_ids)
        top = ", ".join(ids[i] if i < len(ids) else f"#{i}" for i in a.top)
        score = a.scores[a.top[0]] if a.top else 0.0
        return f"{top} {score:.2f}" + (" (tie)" if a.tie else "")
    if which == "failed":
        return e.failed.reason
    if which == "interrupted":
        return e.interrupted.reason
    return ""


# ------------------------------------------------------------ sessions


def sessions_table(sessions: Iterable[pb.SessionSummary]) -> Table:
    table = Table("session", "started", "ended", "messages", "investigations", "labels")
    for s in sessions:
        table.add_row(
            plain(s.session_id),
            when(s.started_at),
            when(s.ended_at),
            str(s.messages),
            str(s.investigations),
            plain(", ".join(f"{k}={v}" for k, v in sorted(s.labels.items()))),
        )
    return table


def session(detail: pb.SessionDetail, investigations: Sequence[pb.Investigation]) -> RenderableType:
    s = detail.session
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("session", plain(s.session_id))
    grid.add_row("system", plain(s.system))
    grid.add_row("started", when(s.started_at))
    grid.add_row("ended", when(s.ended_at) if s.HasField("ended_at") else "not yet")
    for key, value in sorted(s.labels.items()):
        grid.add_row(plain(f"label {key}"), plain(value))
    grid.add_row("messages", str(s.messages))
    grid.add_row("investigations", str(s.investigations))
    parts: list[RenderableType] = [grid]
    if detail.telemetry:
        parts += [
            Rule(f"telemetry (newest {detail.telemetry_window} samples at most)", align="left"),
            _telemetry(detail.telemetry),
        ]
    if investigations:
        parts += [Rule("investigations", align="left"), investigations_table(investigations)]
    if detail.messages:
        parts += [Rule("messages", align="left"), *map(_message, detail.messages)]
        if detail.HasField("next_index"):
            parts.append(Text(f"more follow: --from-index {detail.next_index}"))
    return Group(*parts)


def _telemetry(signals: Sequence[pb.SignalSummary]) -> Table:
    table = Table("component", "signal", "samples", "min", "max", "last", "from", "to")
    for s in signals:
        table.add_row(
            plain(s.component),
            plain(s.signal),
            str(s.samples),
            f"{s.min:g}",
            f"{s.max:g}",
            f"{s.last:g}",
            when(s.first_at),
            when(s.last_at),
        )
    return table


def _message(m: pb.AgentMessage) -> RenderableType:
    head = f"#{m.index} {when(m.sent_at)} {_kind_name(m.kind)} {m.sender}"
    head += f" → {m.recipient}" if m.recipient else ""
    head += f" (tool {m.tool_name})" if m.tool_name else ""
    parts: list[RenderableType] = [plain(head, style="bold"), plain(m.content)]
    parts += [plain(f"tool call: {call}") for call in m.tool_calls]
    return Group(*parts)


def console() -> Console:
    """stdout; wide enough that ids and bars do not wrap when it is not a terminal."""
    stdout = Console()
    return stdout if stdout.is_terminal else Console(width=160)
