"""The OTLP exporter against a real Arize Phoenix: an application's traced run goes both to Phoenix
and to poirotd (as a Collector would fan it out); poirotd's rule opens an investigation, and its
attribution is found by Phoenix's own client on the run's trace, under the span it evaluates,
with one gen_ai.evaluation.result event per region and the link to the investigation's page."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import SPEC, send_run
from poirotd.devtools.process import free_port
from poirotd.exporters.evaluations import EVALUATION_EVENT, SPAN_NAME
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import InvestigationState
from tests.support.daemon import finished_investigation, in_process_daemon
from tests.support.otlp_receiver import counted
from tests.support.phoenix_server import phoenix_server

PAGE = "https://poirot.example.org"


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_phoenix_finds_the_evaluation_on_the_runs_trace(tmp_path: Path) -> None:
    with phoenix_server(tmp_path) as phoenix:
        async with in_process_daemon(
            tmp_path,
            SPEC,
            ScriptedBackend(schema_answer),
            otlp_http_port=free_port(),
            otlp_export_endpoint=phoenix.url,
            otlp_export_link_base_url=PAGE,
        ) as daemon:
            store = daemon._store
            assert store is not None
            endpoint = f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces"
            await asyncio.to_thread(send_run, [endpoint, f"{phoenix.url}/v1/traces"], "visit-9")
            record = await finished_investigation(store, "visit-9", seconds=120)
            assert record.state is InvestigationState.SUCCEEDED
            messages = await store.session_messages("visit-9")
            await counted(daemon.metrics, "exported", 1, seconds=120)
        attribution, space = record.attribution, record.hazard_space
        assert attribution is not None and space is not None
        evaluated = next((m for m in messages if m.index == attribution.step), messages[-1])
        spans = await phoenix.trace_spans(evaluated.trace_id, SPAN_NAME, seconds=120)

    by_id = {span["context"]["span_id"]: span for span in spans}
    [ours] = [span for span in spans if span["name"] == SPAN_NAME]
    assert ours["context"]["trace_id"] == evaluated.trace_id
    assert ours["parent_id"] == evaluated.span_id
    # The span it evaluates is the application's own, as Phoenix stored it from the run.
    assert by_id[evaluated.span_id]["context"]["trace_id"] == evaluated.trace_id
    url = f"{PAGE}/investigations/{record.investigation_id}"
    assert ours["attributes"]["poirot.investigation.id"] == record.investigation_id
    assert ours["attributes"]["poirot.investigation.url"] == url
    events = [event for event in ours["events"] if event["name"] == EVALUATION_EVENT]
    results = {
        event["attributes"]["gen_ai.evaluation.name"]: event["attributes"] for event in events
    }
    assert list(results) == [region.id for region in space.regions]
    for j, region in enumerate(space.regions):
        result = results[region.id]
        assert result["gen_ai.evaluation.score.value"] == pytest.approx(attribution.scores[j])
        assert result["gen_ai.evaluation.score.label"] == (
            "blamed" if attribution.decision[j] else "cleared"
        )
        assert result["gen_ai.evaluation.explanation"].startswith(region.name)
        assert result["poirot.investigation.url"] == url
