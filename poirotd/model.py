"""Domain types shared by every part of the daemon (pydantic inside, protobuf only at the wire)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Annotated, Any, Literal, NamedTuple, TypeAlias

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

RegionType = Literal["agent", "hardware", "software", "physical", "human", "other"]
# Why a vote was forced: the agent used its M replies, or its consultation filled the model's
# context window first ("" when it was not forced).
ForcedBy = Literal["", "invocation_limit", "context_full"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ------------------------------------------------------------------ session data


class MessageKind(enum.StrEnum):
    AGENT = "agent"
    HUMAN = "human"
    TOOL = "tool"
    SYSTEM = "system"


class Session(Frozen):
    session_id: str
    system: str
    started_at: datetime
    ended_at: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class AgentMessage(Frozen):
    """One turn of the monitored system's conversation, in session order."""

    session_id: str
    index: int = Field(ge=0)
    kind: MessageKind
    sender: str
    recipient: str = ""
    content: str = ""
    tool_calls: tuple[str, ...] = ()
    tool_name: str = ""
    sent_at: datetime
    # The OpenTelemetry trace and span (hex) the message was read from, so an attribution can
    # link back to the trace in Langfuse or Phoenix; "" for messages that came another way.
    trace_id: str = ""
    span_id: str = ""


# AgentMessage's validator, from a dict, for the transports that build one per message received:
# pydantic's keyword constructor costs a quarter more per message, and `model_validate`'s Python
# wrapper a fifth more than calling it.
validate_agent_message: Callable[[dict[str, Any]], AgentMessage] = (
    AgentMessage.__pydantic_validator__.validate_python
)


class SessionEnd(Frozen):
    session_id: str
    ended_at: datetime


class TelemetrySample(Frozen):
    session_id: str
    component: str
    signal: str
    value: float
    measured_at: datetime


class Reading(NamedTuple):
    """A telemetry sample of a known session as the store reads it back: a plain tuple, since an
    incident's summary reads thousands while the event loop waits for the interpreter."""

    component: str
    signal: str
    value: float
    measured_at: datetime


# (component, signal, value, measured_at): a sample of a known session as inputs hand it over and
# the rules and a telemetry block keep it. A plain tuple, built per sample at sensor rates.
SampleRow: TypeAlias = tuple[str, str, float, datetime]


# The largest integer every store adapter keeps (SQLite's INTEGER, PostgreSQL's bigint): indexes,
# event ids, producer seqs and the like are checked against it before they reach a store.
MAX_INTEGER = 2**63 - 1
# The longest producer name a transport takes.
MAX_PRODUCER_CHARS = 256
# The OTLP receiver's producers: this prefix, then a span's identity. No other transport takes a
# name with it, so nobody's keys can pass for a span's (and have its message dropped as a copy).
OTLP_PRODUCER_PREFIX = "otlp:"
# The magnitude a telemetry reading may reach when its component declares no range for its
# signal (POIROTD_TELEMETRY_MAX_ABS_VALUE changes it); past it, or outside a declared range, the
# reading is refused. 2**53 (about 9.007e15): the largest magnitude at which a float still holds
# every integer, so a larger counter has lost its units already; far below the float limit.
DEFAULT_MAX_ABS_VALUE = float(2**53)
# The most that setting or a declared range may allow: the squared deviations of a window of
# 65,536 such readings then stay finite (65,536 * (2e150)**2 is about 2.6e305, below 1.8e308).
MAX_ABS_VALUE = 1e150


def _within_max_abs_value(bound: float) -> float:
    if not -MAX_ABS_VALUE <= bound <= MAX_ABS_VALUE:  # NaN fails too
        raise ValueError(f"{bound} is not within ±{MAX_ABS_VALUE:g}, the widest range allowed")
    return bound


# A bound of a range of telemetry values (see MAX_ABS_VALUE).
ValueBound = Annotated[float, AfterValidator(_within_max_abs_value)]


def producer_problem(producer: str) -> str:
    """Why a transport refuses `producer` as a client's idempotency scope ("" if it does not)."""
    if len(producer) > MAX_PRODUCER_CHARS:
        return f"producer is {len(producer)} characters, the limit is {MAX_PRODUCER_CHARS}"
    if producer.startswith(OTLP_PRODUCER_PREFIX):
        return f"producer names starting {OTLP_PRODUCER_PREFIX!r} are the OTLP receiver's"
    if "\x00" in producer:
        # PostgreSQL's text cannot hold it, and SQLite's key lookup (JSON) would miss the key:
        # its second copy then failed the whole commit it was in, other producers' items too.
        return "producer contains a NUL character"
    return ""


def scoped_producer(scope: str, producer: str) -> str:
    """`producer` as named within `scope`: the name the store keys on. A transport scopes the name
    a client gives by who the transport knows the client to be ("mqtt:<topic>",
    "grpc:token:<name>"), so no client can name a key of another and have that one's items
    dropped as copies. The scope ends at the first "|" (one in the scope itself is escaped, with
    "%"), so no name given in one scope is a name of another."""
    return f"{scope_text(scope)}|{producer}"


def scope_text(scope: str) -> str:
    """`scope` with "%" and "|" escaped, as `scoped_producer` writes it."""
    return scope.replace("%", "%25").replace("|", "%7C")


class ItemKey(NamedTuple):
    """A producer's idempotency key: the store keeps an item (or the rows of one delivery) with
    a key at most once. `producer` names one incarnation of a producer, `seq` its item."""

    producer: str
    seq: int


@dataclass(frozen=True, slots=True)
class TelemetryBatch:
    """One session's samples from an input, in arrival order. An MQTT input delivers thousands
    a second; as rows they reach the rules and the store's blocks without a pydantic sample
    each. Whoever builds one guarantees what validating samples would: float values and
    timezone-aware times. `keys`, when given, holds each row's idempotency key (None: none);
    a row whose key an earlier row or item has, or the store holds, is a copy."""

    session_id: str
    rows: list[SampleRow]
    keys: list[ItemKey | None] | None = None

    def samples(self) -> list[TelemetrySample]:
        """The rows as validated samples, for the few places that need them."""
        return [sample_of(self.session_id, row) for row in self.rows]


# A sample's row (attrgetter: C speed, for every sample of a batch).
row_of: Callable[[TelemetrySample], SampleRow] = attrgetter(
    "component", "signal", "value", "measured_at"
)


def sample_of(session_id: str, row: SampleRow) -> TelemetrySample:
    component, signal, value, measured_at = row
    return TelemetrySample(
        session_id=session_id,
        component=component,
        signal=signal,
        value=value,
        measured_at=measured_at,
    )


# One item of an ingest stream (gRPC, replay), in the order the producer sent them.
IngestItem: TypeAlias = Session | SessionEnd | AgentMessage | TelemetrySample
# What the ingest pipeline and the store take: ingest items, and inputs' telemetry batches.
CommitItem: TypeAlias = IngestItem | TelemetryBatch


class HazardEvent(Frozen):
    """A rule fired (or control software asked): the reason an investigation is opened."""

    rule: str
    severity: Literal["info", "warning", "critical"]
    session_id: str
    at: datetime
    # One human-readable line, e.g. "d2w_exoskeleton.ankle_angle_deg z=5.2 over 2.0 s window".
    summary: str
    # The samples that made the rule fire (bounded by the rule engine).
    evidence: tuple[TelemetrySample, ...] = ()


# ------------------------------------------------------------------ hazard space (Phase I)


class HazardRegion(Frozen):
    id: str
    name: str
    type: RegionType
    description: str


# Why Phase I's proposal of a region was left out of the space: an id the spec does not declare
# (or a sub-region of something that is not a component), a sub-region slug that is not one, a
# region proposed twice, a sub-region beyond the spec's bounds.
DropReason = Literal["not_in_spec", "bad_slug", "duplicate", "over_limit"]
DROP_REASONS: tuple[DropReason, ...] = ("not_in_spec", "bad_slug", "duplicate", "over_limit")


class DroppedRegion(Frozen):
    """A region Phase I's model proposed that the space does not hold, and why."""

    # What the model wrote as the id (a sub-region: "parent.slug"), cut to 80 characters.
    proposed: str
    reason: DropReason


class HazardSpace(Frozen):
    """The N error regions votes are cast over; index i of a vote is regions[i].

    Every region id is the spec's own (an agent or component id) or a sub-region id derived
    from a component ("d2w_exoskeleton.ankle_sensor"): a model never mints the ids that metric
    labels, alerts and ConfirmOutcome use.
    """

    system: str
    version: str
    regions: tuple[HazardRegion, ...]
    # llm: built by Phase I; pinned: given in the spec; spec: the spec's declared agents and
    # components, used when Phase I gave no valid answer (cached like the others).
    source: Literal["llm", "pinned", "spec"]
    # What Phase I proposed and the space left out.
    dropped: tuple[DroppedRegion, ...] = ()

    @property
    def size(self) -> int:
        return len(self.regions)

    def index_of(self, region_id: str) -> int:
        for i, region in enumerate(self.regions):
            if region.id == region_id:
                return i
        raise KeyError(region_id)


# ------------------------------------------------------------------ investigations


class InvestigationState(enum.StrEnum):
    # A hazard rule's investigation that found the queue full: kept in the store, and queued
    # (oldest first) as soon as the queue has room, by whichever replica frees it.
    DEFERRED = "deferred"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        return self not in UNFINISHED_STATES


# What a later trigger of the same session joins rather than opening another investigation.
UNFINISHED_STATES = frozenset(
    {InvestigationState.DEFERRED, InvestigationState.QUEUED, InvestigationState.RUNNING}
)


class Phase(enum.StrEnum):
    HAZARD_SPACE = "hazard_space"
    SELF_ASSESSMENT = "self_assessment"
    INTERROGATION = "interrogation"
    VOTING = "voting"
    AGGREGATION = "aggregation"
    # ECHO: the panel of analysts reads the session's hierarchical context.
    ANALYSIS = "analysis"
    # ErrorProbe: MAST tags, the backward trace to the causal chain, then the three roles.
    DETECTION = "detection"
    TRACING = "tracing"
    DIAGNOSIS = "diagnosis"


class Vote(Frozen):
    """One agent's private vote (Phase IV); an abstention carries a reason and no location."""

    agent_id: str
    location: tuple[int, ...] = ()
    hazard_vector: str = ""
    justification: str = ""
    weight: float = 0.0
    abstention_reason: str = ""
    forced: bool = False
    forced_by: ForcedBy = ""
    # "When": the session index of the message where this agent says the fault first shows
    # (None when it did not say, or abstained).
    step: int | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _forced_follows_forced_by(cls, data: Any) -> Any:
        """`forced` is whether `forced_by` names a cause; records from before `forced_by` were
        only ever forced by the invocation limit."""
        if isinstance(data, dict):
            by = data.get("forced_by") or ("invocation_limit" if data.get("forced") else "")
            data = {**data, "forced": bool(by), "forced_by": by}
        return data

    @property
    def abstained(self) -> bool:
        return bool(self.abstention_reason)


class Attribution(Frozen):
    """Phase V result: per-region scores, the top region(s) and the decision rule's vector."""

    scores: tuple[float, ...]
    top: tuple[int, ...]
    tie: bool
    decision: tuple[int, ...]
    rule: str
    beta: float
    # "When": the weighted consensus over the voters' steps (None when no voter gave one).
    step: int | None = Field(default=None, ge=0)


class LLMExchange(Frozen):
    """One prompt and its answer (or failure), kept for audit: what was asked, what came back."""

    phase: Phase
    agent_id: str
    # What the call was for: hazard_space | report | turn | answer | vote | repair
    purpose: str
    messages: tuple[dict[str, str], ...]
    response: str = ""
    error: str = ""
    # The failure's bounded label (unavailable, timeout, bad_response, ...); "" when it answered.
    error_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    seconds: float = 0.0
    at: datetime


class ContextCut(Frozen):
    """One thing the context-budget policy removed or shortened so a prompt fits the model."""

    # The agent whose view was cut ("" for the baseline's single, full-session prompt).
    agent_id: str
    # Session index of the message affected.
    index: int = Field(ge=0)
    action: Literal["dropped", "shortened"]
    chars_before: int = Field(ge=0)
    chars_after: int = Field(ge=0)


# poirot: the five-phase protocol; baseline: one LLM call over the full session; echo: ECHO's
# panel of analysts over a hierarchical context, with confidence-weighted consensus; errorprobe:
# ErrorProbe's MAST tags, backward trace and checked three-role diagnosis with verified memory;
# ensemble: several of these over one session, combined.
InvestigationMethod = Literal["poirot", "baseline", "echo", "errorprobe", "ensemble"]
# The methods an ensemble may combine.
EnsembleMember = Literal["poirot", "baseline", "echo", "errorprobe"]


class PhaseTiming(Frozen):
    phase: Phase
    seconds: float


class LLMUsage(Frozen):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ModelTime(Frozen):
    """How long the model kept an investigation waiting, against the least it could have.

    `busy_seconds` is the union of the calls' intervals; the critical path is the longest chain
    of calls each waiting for the one before (phases in order, each agent's calls in turn);
    `critical_path_seconds` is what that chain costs at the speeds measured on this run's own
    calls (uncached prompt tokens at the prefill speed, generated tokens at the decode speed,
    plus what each call costs whatever its tokens).
    `floor_seconds` is the least the same calls take on the same backend: the critical path, or,
    on a backend serving `serves_at_once` calls at a time (0: as many as come), every call's cost
    shared among those places when that is more (the embedded backend serves one: its floor is
    all its calls end to end). Zero speeds: too few calls to measure them.
    """

    wall_seconds: float = 0.0
    busy_seconds: float = 0.0
    critical_path_calls: int = 0
    critical_path_prompt_tokens: int = 0
    critical_path_completion_tokens: int = 0
    prefill_tokens_per_second: float = 0.0
    decode_tokens_per_second: float = 0.0
    # Fitted beside the speeds: what a call costs whatever its tokens.
    per_call_seconds: float = 0.0
    critical_path_seconds: float = 0.0
    serves_at_once: int = 0
    floor_seconds: float = 0.0


class ConfirmedOutcome(Frozen):
    """What control software confirmed truly caused an investigated incident (ground truth)."""

    # The true cause(s), in hazard-space order, and the same as a decision vector over it.
    region_ids: tuple[str, ...] = Field(min_length=1)
    decision: tuple[int, ...]
    note: str = ""
    at: datetime


class AgentReputation(Frozen):
    """An agent's learned β_i (the reputation variant), as of its latest confirmed outcome."""

    system: str
    agent_id: str
    beta: float = Field(ge=0.0, le=0.5)
    # Confirmed outcomes that updated it, and the latest of them.
    confirmations: int = Field(ge=0)
    investigation_id: str
    updated_at: datetime


class CampaignValue(Frozen):
    """What a fault campaign's outcomes made of one agent's β or one method's reliability."""

    value: float = Field(ge=0.0, le=0.5)
    # The campaign's outcomes that moved it.
    cases: int = Field(ge=1)


class CampaignSeed(Frozen):
    """A fault campaign's labelled outcomes made into β and reliabilities (SeedReputation): a
    source kept apart from confirmed outcomes, weighed in as the spec's campaign_weight says."""

    system: str
    # Where the outcomes came from (a results file, a campaign id), as the operator named it.
    source: str
    seeded_at: datetime
    # The outcomes it used.
    cases: int = Field(ge=1)
    agents: dict[str, CampaignValue] = Field(default_factory=dict)
    methods: dict[str, CampaignValue] = Field(default_factory=dict)


class CampaignOutcome(Frozen):
    """One labelled case as one method attributed it (a line of `poirotd eval`'s results)."""

    case_id: str
    method: InvestigationMethod
    # Index i of `decision`, of every vote's location and of the truth vector is region i.
    region_ids: tuple[str, ...] = Field(min_length=1)
    # Empty when the run gave no attribution: the outcome then moves no reliability.
    decision: tuple[int, ...] = ()
    truth_region_ids: tuple[str, ...] = Field(min_length=1)
    votes: tuple[Vote, ...] = ()


class MemorySignature(Frozen):
    """What an ErrorProbe diagnosis is remembered by: the MAST failure mode, the agent (or
    component) blamed, and the tool involved at the faulty step ("" when none)."""

    mode: str
    agent: str
    tool: str = ""


class DiagnosisMemoryEntry(Frozen):
    """One verified failure pattern in ErrorProbe's memory, with its statistics."""

    entry_id: str
    system: str
    signature: MemorySignature
    # What a later diagnosis should check for this pattern (the Arbiter's guard), and the
    # latest diagnosis it came from.
    recipe: str
    example_claim: str = ""
    example_step: int | None = None
    # How the latest diagnosis was verified: its evidence checks all passed, or ConfirmOutcome.
    verified_by: Literal["evidence", "confirmed"]
    # Frequency: diagnoses verified into this entry; impact: confirmations that agreed or
    # disagreed with a diagnosis that used or made it; recency: when it was last verified.
    frequency: int = Field(ge=1)
    confirmed: int = Field(default=0, ge=0)
    refuted: int = Field(default=0, ge=0)
    retrieved: int = Field(default=0, ge=0)
    created_at: datetime
    last_verified_at: datetime
    # The latest investigations that committed to it, and those whose confirmation was counted
    # (bounded; they make a repeated confirmation count once).
    sources: tuple[str, ...] = ()
    judged: tuple[str, ...] = ()
    # Set when an operator deleted it: never retrieved again (the audit keeps its history).
    deleted_at: datetime | None = None


# The coalesced triggers an investigation keeps; later ones are only counted (`coalesced_omitted`).
MAX_COALESCED = 32


class CoalescedTrigger(Frozen):
    """A trigger that found its session's investigation already open (deferred, queued or
    running, or opened by a hazard within the rule's cooldown) and joined it instead of opening
    another: its reason is kept on that investigation, for the operator (the agents are told the
    reason the investigation was opened for; the session's data they read is the same)."""

    reason: str
    # The rule that fired ("" for a Trigger call) and when: the event's time for a rule, the
    # call's for a Trigger.
    rule: str = ""
    at: datetime
    # The investigation's state when the trigger joined it: one that joined a running or finished
    # investigation came after its run had read the session.
    state: InvestigationState
    # Who asked, for a Trigger call (`requested_by`).
    requested_by: str = ""


class CanaryLabel(Frozen):
    """What a canary replayed, and how its attribution scored against the label."""

    case_id: str
    dataset: str
    # The labelled region(s).
    truth: tuple[str, ...]
    # The decision named exactly the labelled region(s) (False for a wrong or failed run).
    correct: bool = False


class Investigation(Frozen):
    investigation_id: str
    system: str
    session_id: str
    state: InvestigationState
    reason: str
    # Which attribution method runs it (see InvestigationMethod).
    method: InvestigationMethod = "poirot"
    # The rule event that opened the investigation (None for a manual trigger).
    trigger: HazardEvent | None = None
    # What the agents are told about the incident: the reason and the hardware readings (as
    # written; the prompts quote each part as evidence).
    incident: str = ""
    created_at: datetime
    finished_at: datetime | None = None
    hazard_space: HazardSpace | None = None
    # Phase II reports by agent id (None where no valid report could be had).
    reports: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    votes: tuple[Vote, ...] = ()
    attribution: Attribution | None = None
    phases: tuple[PhaseTiming, ...] = ()
    error: str = ""
    usage: LLMUsage = LLMUsage()
    # The model's busy time, critical path and the floor it implies (None until a run ends).
    model_time: ModelTime | None = None
    # What the context-budget policy cut so the prompts fit (empty: nothing was cut).
    context_cuts: tuple[ContextCut, ...] = ()
    # Signs of a prompt-injection attempt in what the prompts quote ("message #3: role_forgery"):
    # recorded for review; the text was quoted as evidence all the same.
    injection_findings: tuple[str, ...] = ()
    # The β each agent's vote was weighed with: the spec's β, or its reputation at the start.
    betas: dict[str, float] = Field(default_factory=dict)
    # Set on a success that lacked something (abstentions, missing reports, the fallback hazard
    # space): what was missing and why. "" for a complete run.
    degraded_reason: str = ""
    # The true cause(s), once control software confirmed them (ConfirmOutcome).
    confirmed: ConfirmedOutcome | None = None
    # What the method found besides votes and scores, as JSON: ECHO's analyses, consensus and
    # disagreement report; ErrorProbe's tags, causal chain, hypotheses, checked evidence and
    # verdict; an ensemble's members, each with its own result. Empty for poirot and baseline.
    findings: dict[str, Any] = Field(default_factory=dict)

    # Earlier confirmed outcomes an operator's correction replaced, oldest first. Left out of the
    # record while empty, so records stored before corrections existed keep their audited form.
    superseded: tuple[ConfirmedOutcome, ...] = Field(default=(), exclude_if=lambda v: not v)
    # Who asked for it: the Trigger caller's identity (poirotd.transports.grpc.clients.
    # client_identity), "" for a hazard rule's. Its queued investigations count against its
    # share of the queue. Left out while empty, like `superseded`.
    requested_by: str = Field(default="", exclude_if=lambda v: not v)
    # The triggers that joined it instead of opening another investigation, oldest first (at most
    # MAX_COALESCED; `coalesced_omitted` counts those beyond). Kept by the store: a run's own
    # writes of the record never drop them. Left out while empty, like `superseded`.
    coalesced: tuple[CoalescedTrigger, ...] = Field(default=(), exclude_if=lambda v: not v)
    coalesced_omitted: int = Field(default=0, ge=0, exclude_if=lambda v: not v)
    # Set while the run waits for the model (no LLM server can serve): since when. Left out
    # while unset, like `superseded`.
    waiting_for_model_since: datetime | None = Field(default=None, exclude_if=lambda v: v is None)
    # Set on a canary's (poirotd.campaigns.canary): a labelled case replayed in a shadow session
    # to measure attribution, never a real incident. It cannot be confirmed and streams no
    # events. Left out while unset, like `superseded`.
    canary: CanaryLabel | None = Field(default=None, exclude_if=lambda v: v is None)

    def joined_by(self, trigger: CoalescedTrigger) -> Investigation:
        """The record with `trigger` coalesced into it (counted only, beyond MAX_COALESCED)."""
        if len(self.coalesced) >= MAX_COALESCED:
            return self.model_copy(update={"coalesced_omitted": self.coalesced_omitted + 1})
        return self.model_copy(update={"coalesced": (*self.coalesced, trigger)})


# ------------------------------------------------------------------ access


# The transports that check credentials.
TransportName = Literal["grpc", "metrics", "otlp_http", "page"]


class AccessDenial(Frozen):
    """A call a transport refused for want of credentials or of a role, kept in the audit chain.
    Never the credential itself: the name it authenticated as, if any."""

    at: datetime
    transport: TransportName
    # The call: "Investigations.Trigger", "GET /metrics".
    call: str
    # poirotd.transports.security.access.DenialReason's value.
    reason: str
    identity: str = ""
    # The role that was missing (reason missing_role).
    role: str = ""
    # The client's address as the transport reports it; in a summary, its host.
    peer: str = ""
    # A summary of refused calls alike (poirotd.transports.security.denials): how many, `at` the
    # first and `until` the last. Left out of a single refusal's record (most records are one).
    count: int = Field(default=1, ge=1, exclude_if=lambda count: count == 1)
    until: datetime | None = Field(default=None, exclude_if=lambda until: until is None)


# ------------------------------------------------------------------ ingest conflicts


# Why a commit set an item aside: its producer's key, or (a message) its session and index, was
# already held by an item of other content. A metric label.
ConflictReason = Literal["key", "index"]
CONFLICT_REASONS: tuple[ConflictReason, ...] = ("key", "index")


class IngestConflict(Frozen):
    """An item a commit set aside instead of storing it or dropping it as a copy: what it held
    (its producer's key, or its session and index) was already held by an item of other content
    (a producer that reused a number, or a client that named another's). Kept in the audit
    chain beside the stored item for an operator to compare (`poirotd audit conflicts`)."""

    at: datetime
    reason: ConflictReason
    session_id: str
    # The key it came with (reason key; a keyed item's index conflict keeps its key too).
    producer: str = ""
    seq: int = Field(default=0, ge=0)
    # The item as it came: a message (its index as numbered) or a reading.
    message: AgentMessage | None = None
    sample: TelemetrySample | None = None
    # Content digests (hex, `poirotd.store.idempotency`): the stored item's is how an operator
    # finds it (a key's: its producer's item in the session with this digest; an index's: the
    # message at that index).
    digest: str
    stored_digest: str

    @model_validator(mode="after")
    def _one_item(self) -> IngestConflict:
        if (self.message is None) == (self.sample is None):
            raise ValueError("a conflict holds one message or one sample")
        return self


# ------------------------------------------------------------------ investigation events


class EventKind(enum.StrEnum):
    STARTED = "started"
    PHASE_BEGUN = "phase_begun"
    PHASE_ENDED = "phase_ended"
    VOTE_CAST = "vote_cast"
    ATTRIBUTION_READY = "attribution_ready"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    # The run waits for the model (reason), and goes on once it answers (seconds waited).
    WAITING_FOR_MODEL = "waiting_for_model"
    MODEL_RETURNED = "model_returned"
    # A hazard rule's run the model failed past its outage budget: DEFERRED, to run again.
    DEFERRED = "deferred"


class InvestigationEvent(Frozen):
    """A persisted progress event; event_id is global and increasing, so Watch can resume."""

    event_id: int
    investigation_id: str
    at: datetime
    kind: EventKind
    phase: Phase | None = None
    seconds: float | None = None
    vote: Vote | None = None
    attribution: Attribution | None = None
    region_ids: tuple[str, ...] = ()
    region_names: tuple[str, ...] = ()
    reason: str = ""
    session_id: str = ""
