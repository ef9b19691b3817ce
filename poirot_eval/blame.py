"""BLAME (CORTEX, TradingAgents): sessions with injected faults, answered as a fault vector.

The hazard space is pinned to the benchmark's dimensions (CORTEX 7, TradingAgents 15) in the
benchmark's order, so a decision vector compares bit for bit with the ground truth. Only the
session itself reaches the attributor: CORTEX cases also hold a `poirot_analysis` phase, and
TradingAgents cases an embedded POIROT run (from the first message without a sender on) plus
the agents' system prompts as `SystemMessage`s; earlier attributions must never be seen.
Only two cases are stored in full; the ground truth of all 21 is in `ground_truth_index.json`.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from poirot_eval.cases import Dataset, EvalCase, GroundTruth
from poirot_eval.parts import message, pinned_space
from poirotd.config.loader import load_spec
from poirotd.config.spec import AgentSpec, ComponentSpec, SystemInfo, SystemSpec
from poirotd.model import AgentMessage, MessageKind

FOLDER = Path("blame")
INDEX = FOLDER / "ground_truth_index.json"

# TradingAgents logs senders as "<agent>_v<8 hex>", one suffix per run.
_RUN_SUFFIX = re.compile(r"_v[0-9a-f]{8}$")


@dataclass(frozen=True)
class Benchmark:
    dataset: Dataset
    # Folder under blame/ and key in the ground-truth index.
    folder: str
    system: SystemInfo
    # The dimensions after the agents, in dimension order.
    components: tuple[ComponentSpec, ...]


def _cortex() -> Benchmark:
    # The demo spec describes CORTEX and its four non-agent dimensions (3..6) in dimension order.
    demo = load_spec(Path(str(resources.files("poirotd.demo").joinpath("cortex.yaml"))))
    return Benchmark("blame-cortex", "cortex", demo.system, demo.components)


def _trading() -> Benchmark:
    system = SystemInfo(
        name="trading_agents",
        description=(
            "TradingAgents: twelve LLM agents that decide whether to buy, sell or hold a stock. "
            "Four analysts (market/technical, fundamentals, news, social media) report; a bull and "
            "a bear researcher debate and a research manager arbitrates; the trader proposes a "
            "plan; risky, safe and neutral analysts debate its risk and the risk manager makes "
            "the final call. Agents post to a shared thread, read market and news data feeds, "
            "and a workflow graph orders their turns; a memory keeps lessons of past trades."
        ),
    )
    components = (
        ComponentSpec(
            id="system_memory",
            name="System Memory",
            type="software",
            description=(
                "Error signature: lessons or past context retrieved from memory are wrong, stale "
                "or missing, and agents act on them. Normal behaviour: retrieval returns the "
                "relevant past situations accurately."
            ),
        ),
        ComponentSpec(
            id="workflow_dag",
            name="Workflow DAG",
            type="software",
            description=(
                "Error signature: agents speak out of order, a step is skipped or repeated, or an "
                "agent receives another step's input. Normal behaviour: analysts, debate, trader, "
                "risk debate and judge run in the defined order, each with its inputs."
            ),
        ),
        ComponentSpec(
            id="external_data_feeds",
            name="External Data Feeds",
            type="other",
            description=(
                "Error signature: prices, financial statements, news or social data reaching the "
                "agents are corrupted, delayed or inconsistent with each other. Normal behaviour: "
                "the feeds deliver accurate, current data."
            ),
        ),
    )
    return Benchmark("blame-trading", "trading_agents", system, components)


_BUILDERS = {"blame-cortex": _cortex, "blame-trading": _trading}


@functools.cache
def benchmark(dataset: Dataset) -> Benchmark:
    return _BUILDERS[dataset]()


def case_ids(data_dir: Path, dataset: Dataset) -> list[str]:
    """The cases stored in full (the others are only in the ground-truth index)."""
    folder = data_dir / FOLDER / benchmark(dataset).folder / "cases"
    return sorted((p.stem for p in folder.glob("*.json")), key=_session_number)


def load(data_dir: Path, dataset: Dataset, case_id: str) -> EvalCase:
    bench = benchmark(dataset)
    spec = _spec(data_dir, bench)
    record = json.loads(
        (data_dir / FOLDER / bench.folder / "cases" / f"{case_id}.json").read_text()
    )
    ids = _ids(spec)
    if len(record["ground_truth_vector"]) != len(ids):
        raise ValueError(f"{case_id}: {len(record['ground_truth_vector'])} dims, space has {ids}")
    agents = set(spec.agent_ids)
    messages = tuple(
        _message(case_id, i, raw, agents)
        for i, raw in enumerate(_session(record["session"]["messages"], bench))
    )
    return EvalCase(
        dataset=dataset,
        case_id=case_id,
        spec=spec,
        messages=messages,
        truth=_truth(record["ground_truth_vector"], ids),
    )


def region_ids(data_dir: Path, dataset: Dataset) -> tuple[str, ...]:
    """The benchmark's dimensions as region ids, index i = dimension i."""
    return _ids(system_spec(data_dir, dataset))


def system_spec(data_dir: Path, dataset: Dataset) -> SystemSpec:
    """The benchmark's system spec, its hazard space pinned to the dimensions in order."""
    return _spec(data_dir, benchmark(dataset))


def truth_index(data_dir: Path, dataset: Dataset) -> dict[str, GroundTruth]:
    """The ground truth of every case of the benchmark, stored in full or not."""
    index = json.loads((data_dir / INDEX).read_text())[benchmark(dataset).folder]
    ids = region_ids(data_dir, dataset)
    return {c["case_id"]: _truth(c["ground_truth_vector"], ids) for c in index["cases"]}


def agent_id(sender: str) -> str:
    """A logged sender as the agent's id (TradingAgents' run suffix removed)."""
    return _RUN_SUFFIX.sub("", sender)


def _spec(data_dir: Path, bench: Benchmark) -> SystemSpec:
    index = json.loads((data_dir / INDEX).read_text())[bench.folder]
    dimensions: list[str] = index["dimensions"]
    records = [
        json.loads(p.read_text())
        for p in (data_dir / FOLDER / bench.folder / "agents").glob("*.json")
    ]
    records.sort(key=lambda r: int(r["dimension_index"]))
    if [r["dimension_index"] for r in records] != list(range(len(records))):
        raise ValueError(f"{bench.folder}: agents do not hold dimensions 0..{len(records) - 1}")
    if len(records) + len(bench.components) != len(dimensions):
        raise ValueError(f"{bench.folder}: agents and components do not cover {dimensions}")
    agents = [
        AgentSpec(id=r["agent_id"], name=dimensions[i], system_prompt=r["system_prompt"])
        for i, r in enumerate(records)
    ]
    return SystemSpec(
        system=bench.system,
        agents=tuple(agents),
        components=bench.components,
        hazard_space=pinned_space(agents, [_signature(r) for r in records], bench.components),
    )


def _ids(spec: SystemSpec) -> tuple[str, ...]:
    """Region ids in pinned order: agents, then components."""
    return spec.agent_ids + tuple(c.id for c in spec.components)


def _signature(agent: dict[str, Any]) -> str:
    """TradingAgents' agent files leave the fault signature empty; the role stands in."""
    signature: str = agent.get("fault_error_signature") or ""
    return signature or (
        f"Error signature: the {agent['display_name']}'s output contradicts its own data or "
        "its role. Normal behaviour: an accurate, role-consistent contribution."
    )


def _session(raw: list[dict[str, Any]], bench: Benchmark) -> list[dict[str, Any]]:
    if bench.folder == "cortex":
        return [m for m in raw if m.get("phase") == "cortex_session"]
    session = []
    for m in raw:
        if m.get("from") is None:  # the embedded POIROT run starts here
            break
        if m["type"] != "SystemMessage":
            session.append(m)
    return session


def _message(case_id: str, index: int, raw: dict[str, Any], agents: set[str]) -> AgentMessage:
    sender = agent_id(raw["from"])
    if raw["type"] == "ToolMessage":
        kind = MessageKind.TOOL
    elif raw["type"] == "AIMessage" or sender in agents:
        kind = MessageKind.AGENT
    elif sender == "system":
        kind = MessageKind.SYSTEM
    else:
        kind = MessageKind.HUMAN
    return message(
        case_id,
        index,
        kind,
        sender,
        raw.get("content") or "",
        recipient=_recipient(raw.get("to") or ""),
        tool_calls=_tool_calls(raw.get("tool_calls")),
        tool_name=raw.get("tool_name") or "",
    )


def _recipient(to: str) -> str:
    """BLAME writes "broadcast" where the wire model leaves the recipient empty."""
    return "" if to in ("", "broadcast") else agent_id(to)


def _tool_calls(value: str | list[str] | None) -> list[str]:
    """CORTEX stores the list as its Python repr ("['a', 'b']")."""
    if value is None:
        return []
    calls = ast.literal_eval(value) if isinstance(value, str) else value
    return [str(c) for c in calls]


def _truth(vector: list[int], ids: tuple[str, ...]) -> GroundTruth:
    return GroundTruth(regions=tuple(r for r, bit in zip(ids, vector, strict=True) if bit))


def _session_number(case_id: str) -> int:
    return int(case_id.rsplit("_", 1)[-1])
