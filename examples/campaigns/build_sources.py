"""Write the clean source cases the example campaigns start from, as one-case JSON files.

    python -m examples.campaigns.build_sources          # writes cortex_demo.json, trading_desk.json

cortex_demo.json: the session `poirotd demo` replays (poirotd/demo/cortex_session.jsonl, spec
cortex.yaml) with the exoskeleton's telemetry over the same 20 seconds, simulated by hwbridge's
exoskeleton WITHOUT the demo's Sensor-X, so a campaign adds the hardware faults itself. The
messages still hold BLAME case 250's injected agent faults (doctor, physio_general): the source's
truth says so, and each variant's truth names only the fault the campaign injected.
trading_desk.json: the trading desk (trading_desk.yaml) in a short clean session, with ACME
quotes from hwbridge's market simulator every second. Both are deterministic (fixed seeds and
times), so the files are rebuilt byte for byte.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from hwbridge import exo, market
from poirot_eval.cases import EvalCase, GroundTruth
from poirot_eval.parts import SESSION_START
from poirotd.config.loader import load_spec
from poirotd.demo.main import demo_file
from poirotd.model import AgentMessage, MessageKind, TelemetrySample

HERE = Path(__file__).parent
# The exoskeleton's slow signals: what the CORTEX rules and agents reason about. The gait
# channels (joints, cables, hundreds of samples a second) are left out to keep variants small.
CORTEX_SIGNALS = ("proprioception_score", "pain_vas", "heart_rate_bpm")
SPREAD = 0.04


def cortex_demo() -> EvalCase:
    spec = load_spec(demo_file("cortex.yaml")).model_copy(update={"inputs": None})
    case_id = "cortex-demo"
    messages = tuple(
        AgentMessage(
            session_id=case_id,
            index=m["index"],
            kind=MessageKind(m["kind"]),
            sender=m["sender"],
            recipient=m.get("recipient", ""),
            content=m.get("content", ""),
            tool_calls=tuple(m.get("tool_calls", ())),
            tool_name=m.get("tool_name", ""),
            sent_at=SESSION_START + timedelta(seconds=m["index"]),
        )
        for m in map(json.loads, demo_file("cortex_session.jsonl").read_text().splitlines())
    )
    config = exo.ExoSimConfig(rate_hz=100, score_interval_s=1.0, seed=4)
    blocks = exo.ExoSimulator(config, origin=SESSION_START).advance(float(len(messages)))
    telemetry = tuple(
        s for s in exo.samples(blocks, case_id, "d2w_exoskeleton") if s.signal in CORTEX_SIGNALS
    )
    return EvalCase(
        dataset="campaign",
        case_id=case_id,
        spec=spec,
        messages=messages,
        truth=GroundTruth(regions=("doctor", "physio_general")),
        telemetry=tuple(sorted(telemetry, key=lambda s: s.measured_at)),
    )


def trading_desk() -> EvalCase:
    spec = load_spec(HERE / "trading_desk.yaml")
    case_id = "trading-desk"
    lines = [json.loads(x) for x in (HERE / "trading_desk_session.jsonl").read_text().splitlines()]
    messages = tuple(
        AgentMessage(
            session_id=case_id,
            index=i,
            kind=MessageKind(m["kind"]),
            sender=m["sender"],
            recipient=m.get("recipient", ""),
            content=m["content"],
            tool_name=m.get("tool_name", ""),
            sent_at=SESSION_START + timedelta(seconds=m["at"]),
        )
        for i, m in enumerate(lines)
    )
    config = market.MarketSimConfig(tick_interval_s=1.0, seed=7)
    ticks = market.MarketSimulator(config, origin=SESSION_START).advance(lines[-1]["at"] + 1.0)
    telemetry = []
    for tick in ticks:
        values = {
            "price": tick.price,
            "bid": tick.price - SPREAD / 2,
            "ask": tick.price + SPREAD / 2,
            "spread": SPREAD,
            "volume": tick.volume,
        }
        telemetry += [
            TelemetrySample(
                session_id=case_id,
                component="market_feed",
                signal=f"{tick.symbol}.{name}",
                value=round(value, 4),
                measured_at=tick.at,
            )
            for name, value in values.items()
        ]
    return EvalCase(
        dataset="campaign",
        case_id=case_id,
        spec=spec,
        messages=messages,
        truth=GroundTruth(regions=()),
        telemetry=tuple(telemetry),
    )


def main() -> None:
    for name, case in (("cortex_demo.json", cortex_demo()), ("trading_desk.json", trading_desk())):
        (HERE / name).write_text(case.model_dump_json(indent=1) + "\n")
        print(f"{HERE / name}: {len(case.messages)} messages, {len(case.telemetry)} samples")


if __name__ == "__main__":
    main()
