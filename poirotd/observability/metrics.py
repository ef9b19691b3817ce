"""Every Prometheus metric the daemon exports, on one registry per daemon instance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from poirotd import __version__
from poirotd.model import DROP_REASONS
from poirotd.protocol.injection import FINDING_KINDS

_PHASE_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_LLM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Wall time over the model-time floor: 1 is the ideal, the target is at most 1.1.
_FLOOR_RATIO_BUCKETS = (1, 1.05, 1.1, 1.25, 1.5, 2, 3, 5, 10, 30)
HTTP_DOORS = ("metrics", "otlp_http")
# Why an HTTP door refused a connection (poirotd.transports.http_server).
HTTP_REFUSALS = ("too_many_connections", "too_many_peer_connections", "request_deadline")


class Metrics:
    """Names follow the project's conventions: prefix poirot_, base units, bounded labels only."""

    def __init__(self, system: str) -> None:
        self.system = system
        self.registry = CollectorRegistry()
        r = self.registry
        Info("poirot_build", "poirotd build information", registry=r).info(
            {"version": __version__, "system": system}
        )
        self.attribution_score = Gauge(
            "poirot_attribution_score",
            "Score S_j of each hazard region in the latest finished investigation",
            ["system", "component"],
            registry=r,
        )
        self.attribution_top = Gauge(
            "poirot_attribution_top",
            "1 for the region(s) with the top score in the latest investigation, else 0",
            ["system", "component"],
            registry=r,
        )
        self.investigations = Counter(
            "poirot_investigations_total",
            "Finished investigations by outcome",
            ["system", "outcome", "method"],
            registry=r,
        )
        self.investigations_in_flight = Gauge(
            "poirot_investigations_in_flight", "Investigations running now", ["system"], registry=r
        )
        self.investigations_taken_over = Counter(
            "poirot_investigations_taken_over_total",
            "Investigations this replica claimed after another replica's lease on them expired "
            "(re-run from the start)",
            ["system"],
            registry=r,
        )
        self.leases_lost = Counter(
            "poirot_investigation_leases_lost_total",
            "Runs this replica stopped because another replica took their investigation over",
            ["system"],
            registry=r,
        )
        # At 0 from the start, like the degraded count: a replica's first takeover is a rise.
        self.investigations_taken_over.labels(system)
        self.leases_lost.labels(system)
        self.queue_depth = Gauge(
            "poirot_investigation_queue_depth",
            "Investigations waiting to run",
            ["system"],
            registry=r,
        )
        self.investigations_coalesced = Counter(
            "poirot_investigations_coalesced_total",
            "Triggers that joined their session's open investigation (deferred, queued, running, "
            "or opened by a hazard within the rule's cooldown) instead of opening another, by "
            "trigger (rule: a hazard rule's event; manual: a Trigger call)",
            ["system", "trigger"],
            registry=r,
        )
        self.investigations_deferred = Counter(
            "poirot_investigations_deferred_total",
            "Hazard rules' investigations kept DEFERRED in the store, to be queued once it has "
            "room: they found the queue full, or the model failed their run past its outage "
            "budget",
            ["system"],
            registry=r,
        )
        # At 0 from the start: the first deferral or coalescing is a rise.
        for trigger in ("rule", "manual"):
            self.investigations_coalesced.labels(system, trigger)
        self.investigations_deferred.labels(system)
        self.oldest_hazard_wait = Gauge(
            "poirot_investigation_oldest_hazard_wait_seconds",
            "How long the oldest hazard rule's investigation that has not started (deferred or "
            "queued) has waited; 0 when none waits",
            ["system"],
            registry=r,
        )
        self.phase_duration = Histogram(
            "poirot_phase_duration_seconds",
            "Duration of each protocol phase",
            ["system", "phase"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.investigation_duration = Histogram(
            "poirot_investigation_duration_seconds",
            "Time from start to attribution (or failure)",
            ["system", "outcome"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.wall_floor_ratio = Histogram(
            "poirot_investigation_wall_floor_ratio",
            "A successful investigation's wall time over its model-time floor (the critical "
            "path of dependent LLM calls at the speeds its calls showed)",
            ["system"],
            buckets=_FLOOR_RATIO_BUCKETS,
            registry=r,
        )
        self.votes = Counter(
            "poirot_votes_total",
            "Votes cast per agent; outcome=abstained when no valid vote could be had",
            ["system", "agent", "outcome"],
            registry=r,
        )
        self.vote_components = Counter(
            "poirot_vote_components_total",
            "Regions named in valid votes (a vote naming two regions counts for both)",
            ["system", "agent", "component"],
            registry=r,
        )
        self.agent_beta = Gauge(
            "poirot_agent_beta",
            "β each agent's vote is weighed with: the spec's β, or its learned reputation",
            ["system", "agent"],
            registry=r,
        )
        self.investigations_degraded = Counter(
            "poirot_investigations_degraded_total",
            "Succeeded investigations that lacked votes, reports or the LLM's hazard space",
            ["system"],
            registry=r,
        )
        # At 0 from the start, so a rate over the first degraded run sees it.
        self.investigations_degraded.labels(system)
        self.hazard_regions_dropped = Counter(
            "poirot_hazard_regions_dropped_total",
            "Regions Phase I's answer proposed that the hazard space left out, by reason",
            ["system", "reason"],
            registry=r,
        )
        for reason in DROP_REASONS:
            self.hazard_regions_dropped.labels(system, reason)
        self.last_attribution = Gauge(
            "poirot_last_attribution_timestamp_seconds",
            "Unix time of the latest attribution",
            ["system"],
            registry=r,
        )
        self.injection_findings = Counter(
            "poirot_injection_findings_total",
            "Signs of a prompt-injection attempt in the text investigations quote to the LLM "
            "(forged boundaries, roles, votes or tool calls; chat-control tokens; hidden or "
            "look-alike characters; instruction phrases), by kind",
            ["system", "kind"],
            registry=r,
        )
        for kind in FINDING_KINDS:  # at 0 from the start, so the first finding shows as a rise
            self.injection_findings.labels(system, kind)
        self.hazard_events = Counter(
            "poirot_hazard_events_total",
            "Hazard events by rule (manual triggers count under rule=manual)",
            ["system", "rule", "severity"],
            registry=r,
        )
        self.llm_up = Gauge(
            "poirot_llm_up",
            "1 when the latest LLM call succeeded, 0 when it failed",
            ["backend"],
            registry=r,
        )
        self.store_up = Gauge(
            "poirot_store_up",
            "1 while the store answers, 0 from a failed read or write (its server stopped, its "
            "disk is full) until it answers again",
            registry=r,
        )
        self.store_last_error = Gauge(
            "poirot_store_last_error",
            "1 for the kind of the store's latest failure (disk_full, io_error, "
            "connection_lost, busy, out_of_resources), 0 for the others",
            ["kind"],
            registry=r,
        )
        self.llm_backend_up = Gauge(
            "poirot_llm_backend_up",
            "1 while an LLM server (a configured base URL) is taken to answer, 0 while its "
            "circuit breaker holds it dead (it is probed until it answers again)",
            ["base_url"],
            registry=r,
        )
        self.llm_calls = Counter(
            "poirot_llm_calls_total",
            "LLM calls by backend and outcome (ok or an error reason)",
            ["backend", "outcome"],
            registry=r,
        )
        self.llm_tokens = Counter(
            "poirot_llm_tokens_total",
            "LLM tokens: prompt (sent), cached (not re-evaluated), completion",
            ["backend", "kind"],
            registry=r,
        )
        self.llm_duration = Histogram(
            "poirot_llm_call_duration_seconds",
            "Latency of one LLM call",
            ["backend"],
            buckets=_LLM_BUCKETS,
            registry=r,
        )
        self.ingested = Counter(
            "poirot_ingest_items_total",
            "Items committed to the store by kind",
            ["kind"],
            registry=r,
        )
        self.duplicates = Counter(
            "poirot_ingest_duplicates_total",
            "Ingest items dropped at commit as copies of items already stored (a producer's "
            "idempotency key already held, or a message's session and index), by kind; a "
            "telemetry delivery counts each of its samples",
            ["kind"],
            registry=r,
        )
        self.ingest_refused = Counter(
            "poirot_ingest_refused_total",
            "Ingest items the daemon refused, whatever the door, by kind and reason (a value "
            "outside its signal's range, a time out of range, an unknown session...); a "
            "telemetry delivery counts each refused sample",
            ["kind", "reason"],
            registry=r,
        )
        # At 0 from the start: an alert on a sensor gone wild needs the series before the first.
        self.ingest_refused.labels("telemetry", "value_out_of_range")
        self.conflicts = Counter(
            "poirot_ingest_conflicts_total",
            "Ingest items set aside at commit, kept in the store's ingest_conflicts: their "
            "producer's key (reason key) or their session and index (reason index) was held by "
            "an item of other content, by kind",
            ["kind", "reason"],
            registry=r,
        )
        self.last_ingest = Gauge(
            "poirot_ingest_last_item_timestamp_seconds",
            "Unix time of the latest committed item, by kind",
            ["kind"],
            registry=r,
        )
        self.audit_head = Gauge(
            "poirot_audit_chain_head_seq",
            "Seq of the audit chain's latest entry at the latest checkpoint",
            ["system"],
            registry=r,
        )
        self.requests_rejected = Counter(
            "poirot_requests_rejected_total",
            "Requests refused with an error status, by RPC and reason",
            ["rpc", "reason"],
            registry=r,
        )
        self.limit_rejections = Counter(
            "poirot_limit_rejections_total",
            "Work a limit refused: each RESOURCE_EXHAUSTED by reason, and llm_token_budget for "
            "investigations whose LLM-token budget ran out",
            ["limit"],
            registry=r,
        )
        # At 0 from the start for the limits a client meets first.
        for limit in (
            "too_many_streams",
            "too_many_watchers",
            "trigger_rate",
            "request_size",
            "llm_token_budget",
        ):
            self.limit_rejections.labels(limit)
        self.ingest_throttled = Counter(
            "poirot_ingest_throttled_seconds_total",
            "Time Ingest streams waited to keep their client to POIROTD_INGEST_RATE_PER_CLIENT",
            registry=r,
        )
        self.otlp_spans = Counter(
            "poirot_otlp_spans_total",
            "Spans received in OTLP trace exports, by transport (grpc, http)",
            ["transport"],
            registry=r,
        )
        self.otlp_rejected_spans = Counter(
            "poirot_otlp_rejected_spans_total",
            "Spans of OTLP exports not stored (reported in partial_success), by reason",
            ["reason"],
            registry=r,
        )
        self.http_connections = Gauge(
            "poirot_http_connections",
            "Connections open on an HTTP door (metrics, otlp_http)",
            ["door"],
            registry=r,
        )
        self.http_connections_refused = Counter(
            "poirot_http_connections_refused_total",
            "Connections an HTTP door refused (too_many_connections, too_many_peer_connections: "
            "answered 503) or aborted (request_deadline: no whole request in time)",
            ["door", "reason"],
            registry=r,
        )
        for door in HTTP_DOORS:  # at 0 from the start, so an increase sees the first
            self.http_connections.labels(door)
            for refusal in HTTP_REFUSALS:
                self.http_connections_refused.labels(door, refusal)
        self.auth_denials = Counter(
            "poirot_auth_denials_total",
            "Calls refused for want of credentials or of a role, by call and reason",
            ["rpc", "reason"],
            registry=r,
        )
        self.auth_denials_unrecorded = Counter(
            "poirot_auth_denials_unrecorded_total",
            "Refused calls counted and logged but not kept in the audit chain (a store error)",
            registry=r,
        )
        self.auth_denials_folded = Counter(
            "poirot_auth_denials_folded_total",
            "Refused calls summarised in the audit chain with other peers' because "
            "POIROTD_AUDIT_DENIAL_MAX_SUMMARIES summaries were already open",
            registry=r,
        )
        self.auth_file_reloads = Counter(
            "poirot_auth_file_reloads_total",
            "Re-reads of the access file after it changed, by outcome (ok, error)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("ok", "error"):  # at 0 from the start, so an increase sees the first
            self.auth_file_reloads.labels(outcome)
        self.insecure_bind = Gauge(
            "poirot_insecure_bind",
            "1 for a port serving a non-loopback address without TLS and authentication "
            "(POIROTD_ALLOW_INSECURE_BIND), else 0",
            ["port"],
            registry=r,
        )

    def record_betas(self, betas: Mapping[str, float]) -> None:
        for agent, beta in betas.items():
            self.agent_beta.labels(self.system, agent).set(beta)

    def record_attribution(
        self, region_ids: Sequence[str], scores: Sequence[float], top: Sequence[int]
    ) -> None:
        """Publishes the latest attribution; regions of an older hazard space are removed."""
        for family in (self.attribution_score, self.attribution_top):
            family.clear()
        for index, (region, score) in enumerate(zip(region_ids, scores, strict=True)):
            self.attribution_score.labels(self.system, region).set(score)
            self.attribution_top.labels(self.system, region).set(1 if index in top else 0)
        self.last_attribution.labels(self.system).set_to_current_time()
