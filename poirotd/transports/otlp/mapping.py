"""OTLP spans to agent messages: what the OpenTelemetry GenAI and OpenInference conventions say an
agent said. Pure (no I/O, no clock), so it is tested on recorded exports alone; the receiver
numbers the messages and hands them to the ingest pipeline.

Which spans speak (docs/operating/otlp.md has the full table):
- a model call (`gen_ai.operation.name` chat / text_completion / generate_content, or
  `openinference.span.kind` LLM): its output messages are the agent's turns; of its input, only
  what follows the last assistant turn is new (the user's request, tool results, the system
  instructions of a first call), the rest is history that was stored when it happened (an input
  ending with an assistant turn is another agent's answer handed over with its history: only the
  agent's own instructions are new);
- a tool call (`execute_tool`, or TOOL): its result is a tool message to the calling agent;
- an agent invocation (`invoke_agent`, or AGENT) speaks like a model call when it carries
  messages, and otherwise only names the agent of the spans below it.
A message is placed at the time it happened (a span's input at its start, its output at its end),
ties by span id, and a message two spans carry (an agent's answer on its invocation and on its
last model call) is kept once. A speaking span that names no agent of the spec, carries no
content, or whose attributes do not decode is rejected with a reason; other spans (HTTP, a
database, a workflow step) are structure only.
A span's GenAI log events (log_records, joined by log_join) are read as the span's own content
(`map_logged`; docs/otlp-logs.md has their table).
"""

from __future__ import annotations

import base64
import hashlib
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Any, Literal, NamedTuple

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from poirotd.errors import quote
from poirotd.model import OTLP_PRODUCER_PREFIX, ItemKey, MessageKind, scope_text

SessionBy = Literal["conversation", "trace"]

# Why a span was rejected: bounded, the label of poirot_otlp_rejected_spans_total.
REJECT_REASONS = ("unknown_agent", "no_content", "malformed")

_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_SYSTEM_ROLES = ("system", "developer")
# Where a span names its agent, in the order they are asked (the span's own first, then its
# ancestors'); a LangGraph node's name is in OpenInference's `metadata` as `langgraph_node`.
_AGENT_KEYS = ("gen_ai.agent.name", "gen_ai.agent.id", "agent.name", "graph.node.id")
_SESSION_KEYS = ("gen_ai.conversation.id", "session.id")
# The older GenAI conventions: one span event per message.
_INPUT_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_CHOICE_EVENT = "gen_ai.choice"
# The current conventions' log event: a model call's messages, as its span would carry them.
DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_DETAILS_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions")
# The log events that speak for their span (log_records reads them).
LOG_EVENTS = frozenset({*_INPUT_EVENTS, _CHOICE_EVENT, DETAILS_EVENT})
# What the log join keeps of a span's attributes: what names its agent, conversation and role.
_TREE_KEYS = frozenset(
    {*_AGENT_KEYS, *_SESSION_KEYS, "metadata", "gen_ai.operation.name", "openinference.span.kind"}
)
# A parent chain longer than this is a loop (or an attack), not a trace.
_MAX_DEPTH = 64
_MAX_SESSION_ID = 256
_TRACE_ID_HEX = 32
_SPAN_ID_HEX = 16


class MappedMessage(NamedTuple):
    """An agent message read from a span, not yet numbered in its session (a tuple: an export
    makes one per span, and a frozen dataclass costs several times as much to build)."""

    session_id: str
    kind: MessageKind
    sender: str
    recipient: str
    content: str
    tool_calls: tuple[str, ...]
    tool_name: str
    at_ns: int
    trace_id: str
    span_id: str
    position: int
    span_start_ns: int
    # Set on a message read from a log record (map_logged): its key's seq, from what it says,
    # since a span's log records may come over several exports (positions would shift).
    logged_seq: int | None = None

    def key(self, caller: str = "") -> ItemKey | None:
        """Its idempotency key: the span's identity and its place among the span's messages,
        which an exporter's retry (the same export, or the span batched anew) resends unchanged
        (a span's messages depend on the span alone; who receives a tool result and which
        session they join may depend on the export's other spans, so neither is part of it).
        The span's start time leads the producer (fixed-width hex): keys then reach the
        store's table in about their order, appended to its B-tree rather than written all
        over it (measured on SQLite: 8 µs a message more at commit than without keys,
        against 18-20 µs, growing with the table, with trace and span ids first; BENCHMARKS.md),
        and a new span's producer sorts above every stored one, so SQLite need not look it up
        (3-4 µs a message more at commit since).
        `caller`: who the exporter authenticated as ("": authentication is off), after the
        span's identity (its fixed width ends it): an exporter's span ids are its own, so
        another cannot send a span of the same ids first and have this one's messages dropped
        as copies; leading with the time keeps the order above.
        None for a span without a valid trace and span id (all zeros, or not 16 and 8 bytes):
        such spans would share a key, so they are stored at least once, as before.
        A message read from a log record has keys of its own (`~log` after the span's identity,
        its seq from what it says), apart from those of the span's own content."""
        if len(self.trace_id) != _TRACE_ID_HEX or len(self.span_id) != _SPAN_ID_HEX:
            return None
        if not self.trace_id.strip("0") or not self.span_id.strip("0"):
            return None
        producer = f"{OTLP_PRODUCER_PREFIX}{self.span_start_ns:016x}{self.trace_id}{self.span_id}"
        seq = self.position
        if self.logged_seq is not None:
            producer, seq = f"{producer}~log", self.logged_seq
        if caller:
            producer = f"{producer}|{scope_text(caller)}"
        return ItemKey(producer, seq)

    def said(self) -> bytes:
        """What the message says, to whom, in which session (a tool result by its text and the
        agent it went to: a tool span and the next model call's input name its tool
        differently, if at all): a message two spans, or a span and its log records, carry is
        kept once."""
        return hashlib.blake2b(orjson.dumps(_identity(self)), digest_size=16).digest()


# A message's place: the time it happened, ties by span id, then its place in its span.
MESSAGE_ORDER = operator.attrgetter("at_ns", "span_id", "position")
# The order spans are placed in (model calls and invocations, then tool calls).
_BY_START = operator.attrgetter("start_ns", "span_id")


@dataclass(frozen=True)
class Rejection:
    trace_id: str
    span_id: str
    reason: str
    detail: str


class LoggedEvent(NamedTuple):
    """A GenAI log record that speaks for its span (log_records reads them): an older
    convention's per-message event and its body, or DETAILS_EVENT and its attributes."""

    name: str
    body: dict[str, Any]
    at_ns: int


@dataclass(frozen=True)
class MappedExport:
    # In session order (every session's messages in the order they happened).
    messages: tuple[MappedMessage, ...]
    rejections: tuple[Rejection, ...]
    spans: int


class _MalformedError(ValueError):
    pass


class _Call(NamedTuple):
    id: str
    name: str
    arguments: str

    def rendered(self) -> str:
        return f"{self.name}({self.arguments})" if self.arguments else self.name


class _Turn(NamedTuple):
    role: str
    text: str = ""
    calls: tuple[_Call, ...] = ()
    # Tool results the turn carries: (call id, tool name, result).
    results: tuple[tuple[str, str, str], ...] = ()


@dataclass(slots=True)
class ReadSpan:
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    role: str = ""
    # The conversation the span itself names ("" if none), or why that name is refused.
    conversation: str = ""
    bad_conversation: str = ""
    agent: str = ""
    session_id: str = ""


def map_export(
    request: ExportTraceServiceRequest, agents: Mapping[str, str], *, session_by: SessionBy
) -> MappedExport:
    """The export's messages and the spans rejected. `agents`: agent id by each name a trace
    may give it (SystemSpec.agents_by_alias)."""
    return map_spans(read_spans(request), agents, session_by=session_by)


def read_spans(request: ExportTraceServiceRequest) -> list[ReadSpan]:
    """The export's spans as the mapping reads them (the log join remembers them too)."""
    return [
        _span(span)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


def map_spans(
    spans: Sequence[ReadSpan], agents: Mapping[str, str], *, session_by: SessionBy
) -> MappedExport:
    """map_export on spans already read."""
    trace = SpanTree(spans, session_by)
    messages: list[MappedMessage] = []
    rejections: list[Rejection] = []
    callers = _Callers()
    # Model calls and invocations first, in time order: their tool calls name the agents tool
    # results go to.
    calls = sorted((span for span in spans if span.role and span.role != "tool"), key=_BY_START)
    tools = sorted((span for span in spans if span.role == "tool"), key=_BY_START)
    for span in calls + tools:
        try:
            messages += _place(span, trace, agents, callers)
        except _RejectedError as rejected:
            rejections.append(
                Rejection(span.trace_id, span.span_id, rejected.reason, str(rejected))
            )
    messages.sort(key=MESSAGE_ORDER)
    return MappedExport(tuple(_first_of_each(messages)), tuple(rejections), len(spans))


@dataclass
class _Callers:
    """The agent that called a tool, by the call's id, else by the tool's latest call in the
    trace (an OpenInference TOOL span under LangGraph's tools node names neither)."""

    by_id: dict[str, str] = field(default_factory=dict)
    by_tool: dict[tuple[str, str], str] = field(default_factory=dict)

    def called(self, span: ReadSpan, call: _Call) -> None:
        if call.id:
            self.by_id.setdefault(call.id, span.agent)
        self.by_tool[(span.trace_id, call.name)] = span.agent

    def caller(self, span: ReadSpan, call_id: str, name: str) -> str:
        return self.by_id.get(call_id, "") or self.by_tool.get((span.trace_id, name), "")


class _RejectedError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _place(
    span: ReadSpan,
    trace: SpanTree,
    agents: Mapping[str, str],
    callers: _Callers,
) -> list[MappedMessage]:
    """The span's messages, or raises _RejectedError."""
    span.session_id = _session(span, trace)
    try:
        if span.role == "tool":
            call_id, name, result = _tool_result(span)
            agent = callers.caller(span, call_id, name) or _agent(span, trace, agents)
            if result is None:
                raise _RejectedError(
                    "no_content", f"tool {quote(name)} has no result (content capture off?)"
                )
            return [_tool_message(span, agent, (call_id, name, result), span.end_ns, 0)]
        inputs, outputs = _turns(span)
    except _MalformedError as exc:
        raise _RejectedError("malformed", str(exc)) from None
    if not inputs and not outputs:
        if span.role == "agent":
            return []  # an invocation without messages: its model calls speak
        raise _RejectedError(
            "no_content", "the model call carries no messages (content capture off?)"
        )
    span.agent = _agent(span, trace, agents)
    for turn in outputs:
        for call in turn.calls:
            callers.called(span, call)
    return _speak(span, inputs, outputs)


def _speak(
    span: ReadSpan, inputs: Sequence[_Turn], outputs: Sequence[_Turn]
) -> list[MappedMessage]:
    """A model call's (or invocation's) messages: its new input, then its output. An
    invocation's output may hold its whole run, tool results too (Microsoft Agent Framework's
    does): they are tool messages, as in an input."""
    messages: list[MappedMessage] = []
    last_answer = -1
    names: dict[str, str] = {}
    for i, turn in enumerate(inputs):
        if turn.role == "assistant":
            last_answer = i
        for call in turn.calls:
            if call.id:
                names[call.id] = call.name
    for turn in outputs:
        for call in turn.calls:
            if call.id:
                names[call.id] = call.name
    position = 0
    new = inputs[last_answer + 1 :]
    if inputs and last_answer == len(inputs) - 1:
        # The input ends with an answer: another agent's, handed over with its history (a
        # workflow passing its conversation on); the agent's own instructions are new too.
        new = list(takewhile(lambda turn: turn.role in _SYSTEM_ROLES, inputs))
    for turn in new:
        if turn.results:
            position = _tool_results(span, turn, names, span.start_ns, position, messages)
            continue
        kind = MessageKind.SYSTEM if turn.role in _SYSTEM_ROLES else MessageKind.HUMAN
        sender = "system" if kind is MessageKind.SYSTEM else turn.role or "user"
        messages.append(
            _message(span, kind, sender, span.agent, turn.text, (), "", span.start_ns, position)
        )
        position += 1
    for turn in outputs:
        if turn.results:
            position = _tool_results(span, turn, names, span.end_ns, position, messages)
            continue
        calls = tuple([call.rendered() for call in turn.calls]) if turn.calls else ()
        messages.append(
            _message(
                span, MessageKind.AGENT, span.agent, "", turn.text, calls, "", span.end_ns, position
            )
        )
        position += 1
    return messages


def _tool_results(
    span: ReadSpan,
    turn: _Turn,
    names: Mapping[str, str],
    at_ns: int,
    position: int,
    messages: list[MappedMessage],
) -> int:
    """Appends the turn's tool results as tool messages to the span's agent; the next position."""
    for call_id, name, result in turn.results:
        named = (call_id, name or names.get(call_id, "") or "tool", result)
        messages.append(_tool_message(span, span.agent, named, at_ns, position))
        position += 1
    return position


def _tool_message(
    span: ReadSpan, agent: str, result: tuple[str, str, str], at_ns: int, position: int
) -> MappedMessage:
    _, name, text = result
    return _message(span, MessageKind.TOOL, f"tool:{name}", agent, text, (), name, at_ns, position)


def _message(
    span: ReadSpan,
    kind: MessageKind,
    sender: str,
    recipient: str,
    content: str,
    tool_calls: tuple[str, ...],
    tool_name: str,
    at_ns: int,
    position: int,
) -> MappedMessage:
    return MappedMessage(  # positional: the fields' order, cheaper than keywords
        span.session_id,
        kind,
        sender,
        recipient,
        content,
        tool_calls,
        tool_name,
        at_ns,
        span.trace_id,
        span.span_id,
        position,
        span.start_ns,
    )


def _first_of_each(messages: Sequence[MappedMessage]) -> Iterator[MappedMessage]:
    """Each message once, by who said what to whom (MappedMessage.said)."""
    seen: set[tuple[object, ...]] = set()
    for m in messages:
        key = _identity(m)
        if key not in seen:
            seen.add(key)
            yield m


def _identity(m: MappedMessage) -> tuple[object, ...]:
    sender = "" if m.kind is MessageKind.TOOL else m.sender
    return (m.session_id, m.kind.value, sender, m.recipient, m.content, m.tool_calls)


# ------------------------------------------------------------------ log records of a span


def remembered(span: ReadSpan) -> ReadSpan:
    """The span as the log join keeps it between exports: its place in the tree and what names
    its agent and conversation, not its content (that was stored when the span came)."""
    attrs = {key: value for key, value in span.attrs.items() if key in _TREE_KEYS}
    return ReadSpan(
        span.trace_id,
        span.span_id,
        span.parent_id,
        span.start_ns,
        span.end_ns,
        attrs,
        [],
        span.role,
        span.conversation,
        span.bad_conversation,
    )


def settled(span: ReadSpan, tree: SpanTree, agents: Mapping[str, str]) -> bool:
    """Whether what the span tree says of the span can no longer change: the tree above it
    reaches its root, or names an agent of the spec and (unless sessions are traces) a
    conversation. Until then a log record of the span waits: the spans above a model call end,
    and are exported, after it."""
    agent = conversation = False
    node: ReadSpan | None = None
    for node in tree.lineage(span):
        agent = agent or any(name in agents for name in _agent_names(node.attrs))
        conversation = conversation or bool(node.conversation or node.bad_conversation)
    if node is not None and not node.parent_id:
        return True
    return agent and (conversation or not tree.by_conversation)


def map_logged(
    span: ReadSpan, events: Sequence[LoggedEvent], tree: SpanTree, agents: Mapping[str, str]
) -> tuple[list[MappedMessage], Rejection | None]:
    """The messages a span's log records say, read as if the span carried them (older
    conventions: as its events; the current one: as its attributes), or why they cannot be
    placed. Their keys come from what they say (MappedMessage.logged_seq)."""
    speaking = ReadSpan(
        span.trace_id,
        span.span_id,
        span.parent_id,
        span.start_ns,
        span.end_ns,
        dict(span.attrs),
        [],
        span.role if span.role in ("llm", "agent") else "llm",
        span.conversation,
        span.bad_conversation,
    )
    for event in sorted(events, key=operator.attrgetter("at_ns")):
        if event.name == DETAILS_EVENT:
            speaking.attrs.update((k, v) for k, v in event.body.items() if k in _DETAILS_KEYS)
        elif _has_content(event.body):
            speaking.events.append((event.name, event.body))
    try:
        messages = _place(speaking, tree, agents, _Callers())
    except _RejectedError as rejected:
        return [], Rejection(span.trace_id, span.span_id, rejected.reason, str(rejected))
    return [m._replace(logged_seq=_logged_seq(m)) for m in messages], None


def _has_content(body: Mapping[str, Any]) -> bool:
    """An older event with something said: content or tool calls (with content capture off,
    the instrumentation still sends the events, empty)."""
    message = body.get("message", body)
    return isinstance(message, dict) and bool(message.get("content") or message.get("tool_calls"))


def _logged_seq(m: MappedMessage) -> int:
    """A seq from what the message says, within its span (60 bits: every store keeps it)."""
    said = orjson.dumps((m.kind.value, m.sender, m.recipient, m.content, m.tool_calls))
    return int.from_bytes(hashlib.blake2b(said, digest_size=8).digest()) >> 4


# ------------------------------------------------------------------ spans and their attributes


def _span(span: Span) -> ReadSpan:
    attrs = attributes(span.attributes)
    # Most spans have no events: asking is cheaper than iterating an empty protobuf list.
    events = [(e.name, attributes(e.attributes)) for e in span.events] if span.events else []
    start = span.start_time_unix_nano
    end = span.end_time_unix_nano
    conversation, bad_conversation = _conversation(attrs)
    return ReadSpan(  # positional: the fields' order, cheaper than keywords
        span.trace_id.hex(),
        span.span_id.hex(),
        span.parent_span_id.hex(),
        start,
        end if end > start else start,
        attrs,
        events,
        _role(attrs, events),
        conversation,
        bad_conversation,
    )


def _role(attrs: Mapping[str, Any], events: Sequence[tuple[str, dict[str, Any]]]) -> str:
    operation = attrs.get("gen_ai.operation.name")
    if not isinstance(operation, str):  # a list is not hashable: not even asked of the set
        operation = ""
    kind = attrs.get("openinference.span.kind")
    kind = kind.upper() if isinstance(kind, str) else ""
    if operation in _LLM_OPERATIONS or kind == "LLM":
        return "llm"
    if operation == "execute_tool" or kind == "TOOL":
        return "tool"
    if operation == "invoke_agent" or kind == "AGENT":
        return "agent"
    if any(name in _INPUT_EVENTS or name == _CHOICE_EVENT for name, _ in events):
        return "llm"  # an older instrumentation: messages as events, no operation name
    return ""


def attributes(pairs: Sequence[KeyValue]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for pair in pairs:
        value = pair.value
        # Most attributes are strings: read as one first (an empty one is read again).
        text = value.string_value
        attrs[pair.key] = text if text else any_value(value)
    return attrs


def any_value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {pair.key: any_value(pair.value) for pair in value.kvlist_value.values}
    return None if which is None else getattr(value, which)


def _agent(span: ReadSpan, trace: SpanTree, agents: Mapping[str, str]) -> str:
    """The agent the span or its nearest ancestor names that the spec knows."""
    for key in _AGENT_KEYS:  # most spans that speak name their agent themselves
        name = span.attrs.get(key)
        if isinstance(name, str) and name and name in agents:
            return agents[name]
    named: list[str] = []
    for node in trace.lineage(span):
        for name in _agent_names(node.attrs):
            if name in agents:
                return agents[name]
            named.append(name)
    if named:
        detail = f"names {', '.join(quote(n) for n in named[:3])}, no agent of the spec"
        raise _RejectedError("unknown_agent", f"{detail} (add it to an agent's aliases)")
    raise _RejectedError("unknown_agent", "neither the span nor its ancestors name an agent")


def _agent_names(attrs: Mapping[str, Any]) -> Iterator[str]:
    for key in _AGENT_KEYS:
        name = attrs.get(key)
        if isinstance(name, str) and name:
            yield name
    metadata = attrs.get("metadata")
    if isinstance(metadata, str) and "langgraph_node" in metadata:
        try:
            node = orjson.loads(metadata).get("langgraph_node")
        except (ValueError, AttributeError):
            return
        if isinstance(node, str) and node:
            yield node


def _session(span: ReadSpan, trace: SpanTree) -> str:
    """The conversation the span or an ancestor names, else its trace's, else its trace id (all
    of them only with session_by "conversation")."""
    if not trace.by_conversation:
        return span.trace_id
    if span.bad_conversation:  # most spans that speak name theirs, or none above them does
        raise _RejectedError("malformed", span.bad_conversation)
    if span.conversation:
        return span.conversation
    for node in trace.lineage(span):
        if node.bad_conversation:
            raise _RejectedError("malformed", node.bad_conversation)
        if node.conversation:
            return node.conversation
    return trace.conversation(span.trace_id)


class SpanTree:
    """The export's spans by trace: each span's parent, each trace's conversation id (from its
    earliest span that names one, else the trace id). Both indexes are built on first use: most
    spans that speak name their agent and conversation themselves."""

    def __init__(self, spans: Sequence[ReadSpan], session_by: SessionBy) -> None:
        self._spans = spans
        self.by_conversation = session_by == "conversation"
        self._by_key: dict[tuple[str, str], ReadSpan] | None = None
        self._conversations: dict[str, str] | None = None

    def lineage(self, span: ReadSpan) -> Iterator[ReadSpan]:
        """The span, its parent, and so on, as far as the export holds them."""
        if self._by_key is None:
            self._by_key = {(s.trace_id, s.span_id): s for s in self._spans}
        by_key = self._by_key
        node: ReadSpan | None = span
        for _ in range(_MAX_DEPTH):
            if node is None:
                return
            yield node
            node = by_key.get((node.trace_id, node.parent_id)) if node.parent_id else None

    def conversation(self, trace_id: str) -> str:
        if self._conversations is None:
            self._conversations = {}
            for span in sorted(self._spans, key=_BY_START):
                if span.conversation:
                    self._conversations.setdefault(span.trace_id, span.conversation)
        return self._conversations.get(trace_id, trace_id)


def _conversation(attrs: Mapping[str, Any]) -> tuple[str, str]:
    """(the conversation the attributes name or "", what is wrong with it or "")."""
    for key in _SESSION_KEYS:
        value = attrs.get(key)
        if value is None or value == "" or isinstance(value, bool):
            continue
        if isinstance(value, str | int):
            conversation = str(value)
            if len(conversation) > _MAX_SESSION_ID:
                return "", f"{key} is over {_MAX_SESSION_ID} characters"
            return conversation, ""
    return "", ""


# ------------------------------------------------------------------ messages of each convention


def _turns(span: ReadSpan) -> tuple[list[_Turn], list[_Turn]]:
    """(input, output) turns of a model call or invocation, in whichever convention it has."""
    attrs = span.attrs
    if "gen_ai.input.messages" in attrs or "gen_ai.output.messages" in attrs:
        inputs = _genai_turns(attrs.get("gen_ai.input.messages"), "gen_ai.input.messages")
        outputs = _genai_turns(attrs.get("gen_ai.output.messages"), "gen_ai.output.messages")
        instructions = attrs.get("gen_ai.system_instructions")
        if instructions is not None and (text := _genai_parts_text(instructions)):
            inputs.insert(0, _Turn("system", text))
        return inputs, outputs
    if any(key.startswith(("llm.input_messages.", "llm.output_messages.")) for key in attrs):
        return _oi_turns(attrs, "llm.input_messages"), _oi_turns(attrs, "llm.output_messages")
    return _event_turns(span.events)


def _json(value: Any, name: str) -> Any:
    """An attribute that holds JSON as a string, or the same structure as OTLP values."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise _MalformedError(f"{name} is not JSON: {exc}") from None


def _genai_turns(value: Any, name: str) -> list[_Turn]:
    """gen_ai.input.messages / gen_ai.output.messages: [{role, parts: [{type, ...}]}]."""
    if value is None:
        return []
    messages = _json(value, name) if isinstance(value, str) else value
    if not isinstance(messages, list):
        raise _MalformedError(f"{name} is not a list of messages")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _MalformedError(f"{name} is not a list of messages")
        parts = message.get("parts", [])
        if not isinstance(parts, list):
            raise _MalformedError(f"{name}[{i}].parts is not a list of parts")
        texts: list[str] = []
        calls: list[_Call] = []
        results: list[tuple[str, str, str]] = []
        for part in parts:
            if not isinstance(part, dict):
                raise _MalformedError(f"{name}[{i}].parts is not a list of parts")
            kind = part.get("type")
            if kind == "text":
                content = part.get("content")
                texts.append(content if isinstance(content, str) else _text(content))
            elif kind == "tool_call":
                arguments = part.get("arguments")
                calls.append(
                    _Call(_text(part.get("id")), _text(part.get("name")), _compact(arguments))
                )
            elif kind == "tool_call_response":
                results.append((_text(part.get("id")), "", _text(part.get("response"))))
        role = message.get("role")
        turns.append(
            _Turn(
                role if isinstance(role, str) else _text(role),
                texts[0] if len(texts) == 1 else "\n".join(texts),
                tuple(calls) if calls else (),
                tuple(results) if results else (),
            )
        )
    return turns


def _genai_parts_text(value: Any) -> str:
    """gen_ai.system_instructions: [{type: text, content}] (or a plain string)."""
    if value is None:
        return ""
    parts = _json(value, "gen_ai.system_instructions")
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise _MalformedError("gen_ai.system_instructions is not a list of parts")
    return "\n".join(_text(p.get("content")) for p in parts if p.get("type") == "text")


def _oi_turns(attrs: Mapping[str, Any], prefix: str) -> list[_Turn]:
    """OpenInference's flattened list: `<prefix>.<n>.message.role`, `.content`, `.contents.<m>.
    message_content.text`, `.tool_calls.<m>.tool_call.{id,function.name,function.arguments}`,
    `.tool_call_id`, `.name`."""
    turns = []
    for n in _indices(attrs, f"{prefix}."):
        p = f"{prefix}.{n}.message."
        role = _text(attrs.get(p + "role"))
        text = _text(attrs.get(p + "content")) or "\n".join(
            _text(attrs.get(f"{p}contents.{m}.message_content.text"))
            for m in _indices(attrs, f"{p}contents.")
        )
        calls = tuple(
            _Call(
                _text(attrs.get(f"{p}tool_calls.{m}.tool_call.id")),
                _text(attrs.get(f"{p}tool_calls.{m}.tool_call.function.name")),
                _compact(attrs.get(f"{p}tool_calls.{m}.tool_call.function.arguments")),
            )
            for m in _indices(attrs, f"{p}tool_calls.")
        )
        if role == "tool":
            result = (_text(attrs.get(p + "tool_call_id")), _text(attrs.get(p + "name")), text)
            turns.append(_Turn(role, results=(result,)))
        else:
            turns.append(_Turn(role, text, calls))
    return turns


def _indices(attrs: Mapping[str, Any], prefix: str) -> list[int]:
    found = set()
    for key in attrs:
        if key.startswith(prefix):
            index = key[len(prefix) :].partition(".")[0]
            if not index.isdigit() or len(index) > 6:
                raise _MalformedError(f"{quote(key)}: {quote(index)} is not a list index")
            found.add(int(index))
    return sorted(found)


def _event_turns(events: Sequence[tuple[str, dict[str, Any]]]) -> tuple[list[_Turn], list[_Turn]]:
    """The older conventions: gen_ai.{system,user,assistant,tool}.message and gen_ai.choice span
    events, their body in `gen_ai.event.content` (JSON) or as the event's attributes."""
    inputs: list[_Turn] = []
    outputs: list[_Turn] = []
    for name, attrs in events:
        if name not in _INPUT_EVENTS and name != _CHOICE_EVENT:
            continue
        body = (
            _json(attrs["gen_ai.event.content"], name) if "gen_ai.event.content" in attrs else attrs
        )
        if not isinstance(body, dict):
            raise _MalformedError(f"event {name}: the body is not an object")
        if name == _CHOICE_EVENT:
            message = body.get("message", body)
            if not isinstance(message, dict):
                raise _MalformedError("event gen_ai.choice: message is not an object")
            outputs.append(_event_turn("assistant", message))
        else:
            inputs.append(_event_turn(_INPUT_EVENTS[name], body))
    return inputs, outputs


def _event_turn(role: str, body: Mapping[str, Any]) -> _Turn:
    text = _text(body.get("content"))
    if role == "tool":
        return _Turn(role, results=((_text(body.get("id")), _text(body.get("name")), text),))
    calls = body.get("tool_calls") or []
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise _MalformedError("tool_calls is not a list of calls")
    return _Turn(role, text, tuple(_event_call(c) for c in calls))


def _event_call(call: Mapping[str, Any]) -> _Call:
    function = call.get("function") or {}
    if not isinstance(function, dict):
        raise _MalformedError("a tool call's function is not an object")
    arguments = _compact(function.get("arguments"))
    return _Call(_text(call.get("id")), _text(function.get("name")), arguments)


def _tool_result(span: ReadSpan) -> tuple[str, str, str | None]:
    """(call id, tool name, result or None) of a GenAI execute_tool or OpenInference TOOL span."""
    attrs = span.attrs
    if attrs.get("gen_ai.operation.name") == "execute_tool":
        name = _text(attrs.get("gen_ai.tool.name")) or "tool"
        result = attrs.get("gen_ai.tool.call.result")
        return _text(attrs.get("gen_ai.tool.call.id")), name, _optional_text(result)
    name = _text(attrs.get("tool.name")) or "tool"
    call_id, result = _oi_tool_output(attrs)
    return _text(attrs.get("tool.id")) or call_id, name, result


def _oi_tool_output(attrs: Mapping[str, Any]) -> tuple[str, str | None]:
    """(call id, result) of an OpenInference TOOL span's `output.value`, which the LangChain
    instrumentation writes as the tool's ToolMessage in JSON (mime type application/json:
    `{"type": "tool", "data": {"content": ..., "tool_call_id": ...}}`); other output as is."""
    value = attrs.get("output.value")
    if attrs.get("output.mime_type") == "application/json" and isinstance(value, str):
        try:
            document = orjson.loads(value)
        except orjson.JSONDecodeError:
            document = None
        if isinstance(document, dict) and document.get("type") == "tool":
            message = document.get("data")
            if isinstance(message, dict) and "content" in message:
                return _text(message.get("tool_call_id")), _text(message["content"])
    return "", _optional_text(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _text(value: Any) -> str:
    """Text as the conventions give it: a string, or any JSON value written compactly."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return _compact(value)


def _compact(value: Any) -> str:
    """orjson, not json: it refuses the lone surrogates json would let through to the store
    (whose UTF-8 they are not), and nesting json would recurse on until Python's stack ends."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        text: str = value
        try:  # arguments are usually JSON text already: written compactly, like the rest
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
    try:
        return orjson.dumps(value, default=_base64, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError as exc:
        raise _MalformedError(f"a value cannot be written as JSON: {exc}") from None


def _base64(value: Any) -> str:
    """A bytes attribute, as OTLP/JSON writes one."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")
