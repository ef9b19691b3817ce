"""Runs benchmark cases through the daemon's own core: a fresh store per case, one model per run.

Each case is committed through the ingest path gRPC uses and investigated by the daemon's
investigation runner, so a score measures the daemon as deployed, not a harness around the
protocol. Results are appended to `results.jsonl` one durable line per case, which is also what
makes a run resumable: a case whose line is there is not run again.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

from poirot_eval.cases import EvalCase
from poirot_eval.claims import CaseClaims
from poirot_eval.ensemble_lines import ensemble_line
from poirot_eval.journal import RunJournal
from poirot_eval.results import CaseResult, Status, TokenUsage
from poirot_eval.session import session_id_of, session_items
from poirotd.config import LLMSpec, OpenAILLMSpec, Settings, SystemSpec
from poirotd.daemon import Core, build_core
from poirotd.errors import ServiceError
from poirotd.ingest.pipeline import IngestPipeline
from poirotd.llm import LLMBackend
from poirotd.llm.factory import open_backend
from poirotd.model import (
    IngestItem,
    Investigation,
    InvestigationMethod,
    InvestigationState,
    LLMExchange,
)
from poirotd.observability.metrics import Metrics
from poirotd.store import SqliteStore


class Observer(Protocol):
    """Told what the run is doing (the CLI draws a progress bar from it)."""

    def planned(self, total: int, done: int) -> None: ...
    def case_started(self, case: EvalCase) -> None: ...
    def case_finished(self, result: CaseResult) -> None: ...
    def case_skipped(self, case: EvalCase, why: str) -> None: ...


async def run_cases(
    cases: Sequence[EvalCase],
    journal: RunJournal,
    *,
    method: InvestigationMethod,
    llm: LLMSpec,
    observer: Observer,
    backend: LLMBackend | None = None,
    settings: Settings | None = None,
    case_timeout: float | None = None,
    retry: Collection[Status] = (),
    concurrency: int = 1,
    reuse_members: bool = True,
) -> None:
    """Runs every case not yet in the journal (or recorded with a status in `retry`), up to
    `concurrency` at once, taken in order and recorded each as it finishes. A case another
    process on the same directory holds (claims.py) or has recorded meanwhile is skipped.

    The backend is opened from `llm` once for the whole run (loading an embedded model is slow)
    unless one is given; each case's spec is pointed at `llm`, so its record is what that model
    answered. Cancellation (Ctrl-C) abandons the cases in flight, which are then not recorded.
    A case's `seconds` include any wait for a backend shared with the cases beside it.
    With `reuse_members`, an ensemble case whose member lines the journal already holds is
    combined from them instead of run (ensemble_lines.py); the backend is then not opened.
    """
    settings = settings or Settings()
    todo = [c for c in cases if journal.status(c.dataset, c.case_id, method) in (None, *retry)]
    observer.planned(len(cases), len(cases) - len(todo))
    if not todo:
        return
    claims = CaseClaims(journal.folder)
    if method == "ensemble" and reuse_members:
        todo = _combine_recorded(todo, journal, claims, model_label(llm), observer)
        if not todo:
            return
    own = backend is None
    backend = backend or await open_backend(llm)
    queue = iter(todo)

    async def work(backend: LLMBackend) -> None:
        for case in queue:  # shared by the workers: each case is taken once
            key = (case.dataset, case.case_id, method)
            if not claims.take(key):
                observer.case_skipped(case, "being run by another process")
                continue
            try:
                if journal.recorded_elsewhere(*key):
                    observer.case_skipped(case, "recorded by another process")
                    continue
                observer.case_started(case)
                case = case.model_copy(update={"spec": case.spec.model_copy(update={"llm": llm})})
                result = await run_case(
                    case,
                    backend,
                    method=method,
                    model=model_label(llm),
                    settings=settings,
                    limit_seconds=case_timeout,
                )
                journal.append(result)
                observer.case_finished(result)
            finally:
                claims.release(key)

    workers = [asyncio.create_task(work(backend)) for _ in range(min(concurrency, len(todo)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if own:
            await backend.aclose()


def _combine_recorded(
    cases: Sequence[EvalCase],
    journal: RunJournal,
    claims: CaseClaims,
    model: str,
    observer: Observer,
) -> list[EvalCase]:
    """Records the ensemble line of every case whose members' lines can stand in for a run;
    returns the cases that must run."""
    left = []
    for case in cases:
        key = (case.dataset, case.case_id, "ensemble")
        if not claims.take(key):
            observer.case_skipped(case, "being run by another process")
            continue
        try:
            line = ensemble_line(case, journal.case_lines(case.dataset, case.case_id), model)
            if line is None:
                left.append(case)
            elif not journal.recorded_elsewhere(*key):
                journal.append(line)
                observer.case_finished(line)
        finally:
            claims.release(key)
    return left


def model_label(llm: LLMSpec) -> str:
    """The served model's name, or the embedded model file's."""
    if isinstance(llm, OpenAILLMSpec):
        return llm.model
    return llm.model_path.name if llm.model_path is not None else "embedded default"


async def run_case(
    case: EvalCase,
    backend: LLMBackend,
    *,
    method: InvestigationMethod,
    model: str,
    settings: Settings,
    limit_seconds: float | None = None,
) -> CaseResult:
    """One case on a fresh core and a temporary store: ingest, trigger, wait for the end.

    A case the daemon refuses or that overruns `limit_seconds` is a result too, not an exception:
    a run records every case it attempts.
    """
    started = time.monotonic()
    outcome = _Outcome(case, method, model)
    with tempfile.TemporaryDirectory(prefix="poirotd-eval-") as folder:
        store = await SqliteStore.open(Path(folder) / "case.db", synchronous="NORMAL")
        spec = without_triggers(case.spec)
        core = build_core(spec, store, backend, Metrics(spec.system.name), settings)
        core.runner.start()
        try:
            async with asyncio.timeout(limit_seconds):
                investigation = await _investigate(core, case, method, settings.ingest_batch_max)
            exchanges = await core.investigations.exchanges(investigation.investigation_id)
        except ServiceError as exc:
            return outcome.result("failed", str(exc), time.monotonic() - started)
        except TimeoutError:
            return outcome.result(
                "timeout", f"not finished after {limit_seconds} s", time.monotonic() - started
            )
        finally:
            await core.runner.drain(0)
            await core.pipeline.drain()
            await store.close()
    return outcome.of(investigation, exchanges, time.monotonic() - started)


def without_triggers(spec: SystemSpec) -> SystemSpec:
    """The spec without its hazard rules. A case is investigated once, by the method asked: a
    rule firing as the session is ingested (a campaign variant's validated hazard does, by
    design) would open a POIROT investigation of its own ahead of it, costing a whole POIROT
    run per case and delaying the one measured."""
    return spec.model_copy(update={"rules": ()}) if spec.rules else spec


async def _investigate(
    core: Core, case: EvalCase, method: InvestigationMethod, batch_max: int
) -> Investigation:
    session_id = session_id_of(case)
    await _ingest(core.pipeline, session_items(case, session_id), batch_max)
    reason = f"evaluation: {case.dataset} case {case.case_id}"
    investigations = core.investigations
    investigation = await investigations.trigger(session_id, reason, method=method)
    async for _ in investigations.events(
        after_event_id=0, investigation_id=investigation.investigation_id
    ):
        pass  # the stream ends with the investigation's terminal event
    return await investigations.get(investigation.investigation_id)


async def _ingest(pipeline: IngestPipeline, items: Sequence[IngestItem], batch_max: int) -> None:
    """Through the daemon's ingest pipeline, in batches as a gRPC client sends them; a refused
    item fails the case, naming its position in the session."""
    scope = pipeline.scope()
    for start in range(0, len(items), batch_max):
        admission = await pipeline.consume(items[start : start + batch_max], scope)
        if admission.refused:
            refusal = admission.refused[0]
            raise refusal.error.at(f"item {start + refusal.index + 1}")


class _Outcome:
    """Builds a case's result line from its finished investigation, or from why there is none."""

    def __init__(self, case: EvalCase, method: InvestigationMethod, model: str) -> None:
        self._case = case
        self._method = method
        self._model = model

    def result(self, status: Status, error: str, seconds: float, **fields: Any) -> CaseResult:
        fields.setdefault("region_ids", self._spec_region_ids())
        return CaseResult(
            case_id=self._case.case_id,
            dataset=self._case.dataset,
            method=self._method,
            model=self._model,
            status=status,
            error=error,
            truth=self._case.truth,
            seconds=seconds,
            **fields,
        )

    def of(
        self, record: Investigation, exchanges: Sequence[LLMExchange], seconds: float
    ) -> CaseResult:
        fields: dict[str, Any] = {
            "votes": record.votes,
            "tokens": TokenUsage(
                prompt=record.usage.prompt_tokens,
                completion=record.usage.completion_tokens,
                cached=sum(x.cached_tokens or 0 for x in exchanges),
            ),
            "context_cuts": len(record.context_cuts),
        }
        if record.hazard_space is not None:
            fields["region_ids"] = tuple(r.id for r in record.hazard_space.regions)
        if record.attribution is not None:
            a = record.attribution
            fields |= {"decision": a.decision, "scores": a.scores, "step": a.step}
        if record.state is InvestigationState.SUCCEEDED:
            return self.result("ok", "", seconds, **fields)
        context = "context_exceeded" in record.error or any(
            x.error_reason == "context_exceeded" for x in exchanges
        )
        status: Status = "context_exceeded" if context else "failed"
        return self.result(status, record.error or record.state.value, seconds, **fields)

    def _spec_region_ids(self) -> tuple[str, ...]:
        """The regions the case is answered in when no hazard space was built: the pinned ones,
        else the spec's agents and components (as the protocol's own fallback orders them)."""
        spec = self._case.spec
        if spec.hazard_space is not None:
            return tuple(r.id for r in spec.hazard_space.regions)
        return (*spec.agent_ids, *(c.id for c in spec.components))
