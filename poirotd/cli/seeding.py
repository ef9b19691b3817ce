"""Reading a fault campaign's results for `poirotd seed-reputation`: the lines `poirotd eval`
writes (README, "Case and result formats"), of which seeding needs the case, the method, the
hazard space, the decision, the label and the votes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from poirotd.api.poirot.v1 import poirot_pb2 as pb


class ResultsError(ValueError):
    """A results file that cannot be read; the message names the file and the line."""


def campaign_outcomes(path: Path) -> list[pb.CampaignOutcome]:
    """Every result line of `path` whose run gave an attribution, as a CampaignOutcome."""
    from poirotd.api.poirot.v1 import poirot_pb2 as pb

    outcomes = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: cannot be read ({exc})") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            result: dict[str, Any] = json.loads(line)
            if result.get("status", "ok") != "ok":
                continue
            votes = [
                pb.Vote(
                    agent_id=v["agent_id"],
                    location=v.get("location", ()),
                    abstention_reason=v.get("abstention_reason", ""),
                )
                for v in result.get("votes", ())
            ]
            outcomes.append(
                pb.CampaignOutcome(
                    case_id=result["case_id"],
                    method=result["method"],
                    region_ids=result["region_ids"],
                    decision=result.get("decision", ()),
                    truth_region_ids=result["truth"]["regions"],
                    votes=votes,
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ResultsError(
                f"{path}:{number}: not a result line of `poirotd eval` ({exc!r})"
            ) from exc
    return outcomes
