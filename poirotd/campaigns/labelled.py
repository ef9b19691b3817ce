"""The labelled case: a session with its system spec and its known cause, in the one-case JSON
format `poirotd eval` reads and writes (docs/evaluation.md, "Case and result formats"). A fault
campaign's variants are such files; the daemon reads them for its canaries, poirot_eval for
benchmarks."""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, ValidationError

from poirotd.config.spec import SystemSpec
from poirotd.model import AgentMessage, Frozen, TelemetrySample


class GroundTruth(Frozen):
    """What caused the failure, as the dataset states it, in terms of the case's hazard space.
    What else a label says (a campaign's description of the fault) is ignored here."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # Region ids of the faulty component(s): one for Who&When and TracerTraj, one or more for
    # BLAME (its exact-vector match compares the whole set).
    regions: tuple[str, ...]
    # Session index of the message where the failure began (Who&When, TracerTraj); None for BLAME.
    step: int | None = None


class LabelledCase(Frozen):
    """What every labelled case holds. Fields it does not know (a campaign's description of the
    fault it injected, say) are ignored here: the label is `truth`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    dataset: str
    case_id: str
    # Pins the hazard space, so predictions and truth index the same regions.
    spec: SystemSpec
    # The session as the attributor may see it, in session order (indices 0..n-1).
    messages: tuple[AgentMessage, ...]
    truth: GroundTruth
    # Samples of the session's components (hardware, feeds), in time order; the benchmarks have
    # none, a campaign's hardware and feed variants do. They are the incident's hardware evidence.
    telemetry: tuple[TelemetrySample, ...] = ()


class LabelledCaseError(ValueError):
    """A labelled case file that cannot be used; the message names the file and the problem."""


def read_labelled_case(path: Path) -> LabelledCase:
    """`path` as a LabelledCase, or LabelledCaseError naming the file and its first problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelledCaseError(f"{path}: cannot be read ({exc})") from exc
    try:
        return LabelledCase.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise LabelledCaseError(
            f"{path}: {where}: {first['msg']} (a one-case JSON file as `poirotd eval export` "
            "writes is expected)"
        ) from exc


def case_files(where: Path) -> list[Path]:
    """The case files under `where`: the *.json files of a folder, in name order, or the file."""
    if where.is_dir():
        return sorted(p for p in where.glob("*.json") if p.is_file())
    return [where]
