"""Every Prometheus metric the daemon exports, on one registry per daemon instance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from poirotd import __version__
from poirotd.model import DROP_REASONS
from poirotd.protocol.injection import FINDING_KINDS

_PHASE_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_LLM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
HTTP_TRANSPORTS = ("metrics", "otlp_http", "page")
# Why the page refused a request it could read (poirotd.transports.page): a post from another
# site, a Host that is not its own, a request it cannot use, a confirmation it is not set to take.
PAGE_REFUSALS = ("cross_site", "unknown_host", "bad_request", "read_only")
# Wall time over the model-time floor: 1 is the ideal, the target is at most 1.1.
_FLOOR_RATIO_BUCKETS = (1, 1.05, 1.1, 1.25, 1.5, 2, 3, 5, 10, 30)
# Why an HTTP transport refused a connection (poirotd.transports.http_server).
HTTP_REFUSALS = ("too_many_connections", "too_many_peer_connections", "request_deadline")
# What became of an attribution offered to the OTLP exporter (poirotd.exporters.exporter), and
# why an export was sent again (poirotd.exporters.otlp_client).
OTLP_EXPORT_OUTCOMES = ("exported", "rejected", "refused", "gave_up", "queue_full", "shutdown")
OTLP_EXPORT_RETRY_REASONS = ("throttled", "unavailable", "timeout", "connection", "store")


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
            "path of dependent LLM calls at the speeds its calls showed, or on a backend "
            "serving one call at a time, every call end to end)",
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
            "Ingest items the daemon refused, whatever the transport, by kind and reason (a "
            "value outside its signal's range, a time out of range, an unknown session...); a "
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
        self.otlp_export_attributions = Counter(
            "poirot_otlp_export_attributions_total",
            "Attributions offered to the OTLP exporter, by outcome: exported; rejected (the "
            "receiver's partial success refused the span); refused (an error not worth a "
            "retry); gave_up (POIROTD_OTLP_EXPORT_RETRY_SECONDS spent); queue_full and "
            "shutdown (dropped unsent)",
            ["outcome"],
            registry=r,
        )
        self.otlp_export_retries = Counter(
            "poirot_otlp_export_retries_total",
            "OTLP exports of attributions sent again, by reason (throttled, unavailable, "
            "timeout, connection; store: the session could not be read)",
            ["reason"],
            registry=r,
        )
        self.otlp_export_queued = Gauge(
            "poirot_otlp_export_queued_attributions",
            "Attributions waiting for the OTLP exporter (at most POIROTD_OTLP_EXPORT_QUEUE_SIZE)",
            registry=r,
        )
        for outcome in OTLP_EXPORT_OUTCOMES:  # at 0 from the start, so an increase sees the first
            self.otlp_export_attributions.labels(outcome)
        for retry in OTLP_EXPORT_RETRY_REASONS:
            self.otlp_export_retries.labels(retry)
        self.otlp_log_records = Counter(
            "poirot_otlp_log_records_total",
            "Log records received in OTLP logs exports, by transport (grpc, http)",
            ["transport"],
            registry=r,
        )
        self.otlp_rejected_log_records = Counter(
            "poirot_otlp_rejected_log_records_total",
            "GenAI log events of OTLP exports not stored, by reason (no_span: their span never "
            "came; the others as for spans)",
            ["reason"],
            registry=r,
        )
        self.otlp_waiting_log_records = Gauge(
            "poirot_otlp_waiting_log_records",
            "GenAI log events accepted and waiting for their span (parked in the store; those "
            "reloaded at start and taken over from replicas gone included)",
            registry=r,
        )
        self.otlp_taken_over_log_records = Counter(
            "poirot_otlp_taken_over_log_records_total",
            "Parked GenAI log events this replica took over from replicas gone (a shared store)",
            registry=r,
        )
        self.http_connections = Gauge(
            "poirot_http_connections",
            "Connections open on an HTTP transport (metrics, otlp_http, page)",
            ["transport"],
            registry=r,
        )
        self.http_connections_refused = Counter(
            "poirot_http_connections_refused_total",
            "Connections an HTTP transport refused (too_many_connections, "
            "too_many_peer_connections: answered 503) or aborted (request_deadline: no whole "
            "request in time)",
            ["transport", "reason"],
            registry=r,
        )
        # At 0 from the start, so an increase sees the first.
        for transport in HTTP_TRANSPORTS:
            self.http_connections.labels(transport)
            for refusal in HTTP_REFUSALS:
                self.http_connections_refused.labels(transport, refusal)
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
            "Re-reads of the access file after it changed, by outcome (ok; error: it did not "
            "load and the previous one stays; missing: it is gone and every call is refused)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("ok", "error", "missing"):  # at 0 from the start: an increase sees one
            self.auth_file_reloads.labels(outcome)
        self.page_refusals = Counter(
            "poirot_page_requests_refused_total",
            "Requests the page refused before reading or changing anything, by reason "
            "(cross_site, unknown_host, bad_request, read_only)",
            ["reason"],
            registry=r,
        )
        for refused in PAGE_REFUSALS:  # at 0 from the start, so an increase sees the first
            self.page_refusals.labels(refused)
        self.page_streams = Gauge(
            "poirot_page_event_streams",
            "Server-sent event streams the page holds open (browsers following investigations)",
            registry=r,
        )
        # poirot_page_info{url}: what the alert rules and the dashboard link to.
        self.page = Info(
            "poirot_page",
            "The page's external URL (POIROTD_PAGE_EXTERNAL_URL), while it is served",
            registry=r,
        )
        self.auth_file_loaded = Gauge(
            "poirot_auth_file_loaded",
            "1 while the access policy in force is the access file as it is now (or none is "
            "configured); 0 while the file is missing (every call refused) or its latest "
            "change did not load (the previous one in force)",
            registry=r,
        )
        self.auth_file_loaded.set(1)
        # Canaries (poirotd.campaigns.canary): labelled cases investigated in shadow sessions.
        # Their own families, so no attribution metric above ever carries a canary's result.
        self.canary_runs = Counter(
            "poirot_canary_runs_total",
            "Canary investigations by method and outcome (correct: named exactly the labelled "
            "region(s); wrong; failed: no attribution)",
            ["system", "method", "outcome"],
            registry=r,
        )
        self.canary_accuracy = Gauge(
            "poirot_canary_accuracy",
            "Share of a method's last canary.window canaries that were correct (failed ones "
            "count as wrong)",
            ["system", "method"],
            registry=r,
        )
        self.canary_accuracy_floor = Gauge(
            "poirot_canary_accuracy_floor",
            "The spec's canary.accuracy_floor: the accuracy the shipped alert wants at least",
            ["system"],
            registry=r,
        )
        self.canary_attribution_duration = Histogram(
            "poirot_canary_attribution_duration_seconds",
            "Time from a canary's start to its attribution (successful canaries)",
            ["system", "method"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.canary_skipped = Counter(
            "poirot_canary_skipped_total",
            "Canaries due but not started: queue_busy (investigations wait in the queue) or "
            "token_budget (the day's canary.token_budget is spent)",
            ["system", "reason"],
            registry=r,
        )
        self.canary_tokens = Counter(
            "poirot_canary_llm_tokens_total",
            "LLM tokens (prompt + completion) canaries spent",
            ["system"],
            registry=r,
        )
        self.canary_cases = Gauge(
            "poirot_canary_cases",
            "Labelled cases the canaries replay (those that loaded and fit the spec)",
            ["system"],
            registry=r,
        )
        self.canary_case_errors = Counter(
            "poirot_canary_case_errors_total",
            "Labelled case files the canaries refused (unreadable, or not of this system)",
            ["system"],
            registry=r,
        )
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
