"""The demo's time to attribution against its model-time floor (issue #33).

    .venv/bin/python -m bench.demo                  # one demo run, about 5 minutes idle
    .venv/bin/python -m bench.demo --times 3        # three, one after the other
    .venv/bin/python -m bench.demo --render bench/demo-runs.json   # redraw the section

Each run is `poirotd demo`'s own path (poirotd/demo/main.py): a daemon process with the
embedded model, a local Mosquitto, the CORTEX session over gRPC, the faulty gait over MQTT, the
rule that fires and the investigation it opens. What is measured is what the investigation's
record says of itself (Investigation.model_time): its wall time, the model's busy time (the
union of its calls' intervals), the floor (every call end to end at the speeds its own calls
showed: the embedded backend serves one call at a time) and the critical path (the chain of
dependent calls at those speeds). wall/floor is what poirotd adds to the time the model needs;
wall/critical path what the serial backend costs against a server that runs the agents side by
side.
The runs are saved (bench/demo-runs.json) and replace this bench's section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.report import ROOT, add_no_write, commit_text, publish
from bench.sections.demo import NAME, render
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.demo.main import demo_daemon, investigate

RUNS = ROOT / "bench" / "demo-runs.json"


@dataclass(frozen=True)
class DemoRun:
    """One demo investigation as its record timed it."""

    started: str
    commit: str
    state: str
    llm_calls: int
    prompt_tokens: int
    completion_tokens: int
    wall_seconds: float
    busy_seconds: float
    floor_seconds: float
    critical_path_seconds: float
    critical_path_calls: int
    critical_path_prompt_tokens: int
    critical_path_completion_tokens: int
    prefill_tokens_per_second: float
    decode_tokens_per_second: float
    per_call_seconds: float
    load_average: float


def run_once() -> DemoRun:
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with (
        tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp,
        demo_daemon(Path(tmp)) as (daemon, broker_port),
    ):
        found = investigate(daemon, broker_port)
    timed = found.model_time
    return DemoRun(
        started=started,
        commit=commit_text(),
        state=pb.InvestigationState.Name(found.state),
        llm_calls=found.llm_calls,
        prompt_tokens=found.prompt_tokens,
        completion_tokens=found.completion_tokens,
        wall_seconds=timed.wall_seconds,
        busy_seconds=timed.busy_seconds,
        floor_seconds=timed.floor_seconds,
        critical_path_seconds=timed.critical_path_seconds,
        critical_path_calls=timed.critical_path_calls,
        critical_path_prompt_tokens=timed.critical_path_prompt_tokens,
        critical_path_completion_tokens=timed.critical_path_completion_tokens,
        prefill_tokens_per_second=timed.prefill_tokens_per_second,
        decode_tokens_per_second=timed.decode_tokens_per_second,
        per_call_seconds=timed.per_call_seconds,
        load_average=os.getloadavg()[0],
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, default=1, help="demo runs, one after the other")
    parser.add_argument("--runs", type=Path, default=RUNS, help="saved runs; new ones added")
    parser.add_argument("--render", type=Path, help="only re-render these saved runs")
    add_no_write(parser)
    args = parser.parse_args(argv)
    saved = args.render or args.runs
    runs = [DemoRun(**r) for r in json.loads(saved.read_text())] if saved.exists() else []
    for _ in range(0 if args.render else args.times):
        runs.append(run_once())
        if not args.no_write:
            args.runs.write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
    publish(NAME, render(runs), write=not args.no_write)


if __name__ == "__main__":
    main()
