"""Phase II: every agent reports on itself and its peers, independently and concurrently.

A missing report is not fatal: the agent still takes part in Phase III, and the summary shows
its report as absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from poirotd.config.spec import SystemSpec
from poirotd.llm.base import ChatMessage
from poirotd.model import Phase
from poirotd.protocol.errors import AnswerFailedError
from poirotd.protocol.events import ReportFiled
from poirotd.protocol.poirot import prompts
from poirotd.protocol.poirot.schemas import SelfReport, report_format
from poirotd.protocol.run import CallSite, RunContext, concurrently


async def self_assess(
    spec: SystemSpec, prefixes: Mapping[str, Sequence[ChatMessage]], run: RunContext
) -> dict[str, SelfReport | None]:
    """Each agent's report (None when it gave no valid one), in spec order."""
    answer = report_format(spec.agent_ids)

    async def report(agent_id: str) -> SelfReport | None:
        task = ChatMessage(role="user", content=prompts.self_assessment(spec, agent_id))
        try:
            filed = await run.until_valid(
                CallSite(Phase.SELF_ASSESSMENT, agent_id, "report"),
                [*prefixes[agent_id], task],
                answer,
                max_tokens=spec.protocol.report_max_tokens,
                retries=spec.protocol.invalid_json_retries,
            )
        except AnswerFailedError as exc:
            await run.emit(ReportFiled(agent_id=agent_id, report=None, error=str(exc)))
            return None
        await run.emit(ReportFiled(agent_id=agent_id, report=filed.model_dump(mode="json")))
        return filed

    reports = await concurrently(report(a) for a in spec.agent_ids)
    return dict(zip(spec.agent_ids, reports, strict=True))
