"""bench.demo's section: each demo run's wall time against the model's busy time and the
floor its critical path sets."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bench.report import begin_marker, end_marker

if TYPE_CHECKING:
    from bench.demo import DemoRun

NAME = "bench.demo"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def _row(r: DemoRun) -> str:
    cells = (
        r.started[:16].replace("T", " "),
        r.commit,
        r.state.removeprefix("INVESTIGATION_STATE_").lower(),
        str(r.llm_calls),
        f"{r.wall_seconds:.0f} s",
        f"{r.busy_seconds:.0f} s",
        f"{r.floor_seconds:.0f} s ({r.critical_path_calls} calls, "
        f"{r.critical_path_prompt_tokens} + {r.critical_path_completion_tokens} tokens)",
        f"**{_ratio(r.wall_seconds, r.busy_seconds)}**",
        f"**{_ratio(r.wall_seconds, r.floor_seconds)}**",
        f"{r.prefill_tokens_per_second:.0f} / {r.decode_tokens_per_second:.1f}",
        f"{r.load_average:.1f}",
    )
    return "| " + " | ".join(cells) + " |"


def render(runs: Sequence[DemoRun]) -> str:
    columns = (
        "started (UTC)", "commit", "state", "calls", "wall", "model busy",
        "floor (critical path)", "wall/busy", "wall/floor", "prefill / decode tok/s", "load",
    )  # fmt: skip
    head = "| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns)
    rows = "\n".join(_row(r) for r in runs)
    return f"""{begin_marker(NAME)}
## The demo against its model-time floor (`python -m bench.demo`)

{platform.machine()}, Python {platform.python_version()}, 2 shared CPUs, the embedded
SmolLM2-135M-Instruct (llama.cpp) serving one call at a time. Each row is one run of `poirotd
demo`'s path (a daemon process, Mosquitto, the CORTEX session over gRPC, the faulty gait over
MQTT, the rule, the investigation) timed by the investigation's own record.

{head}
{rows}

- **wall/busy** is what poirotd adds around the model's own time (scheduling, parsing, the
  store, the gRPC events): the issue's goal of at most 1.1x, on a backend that serves one call
  at a time.
- **wall/floor** is the serial backend's cost: the floor is the longest chain of calls each
  waiting for the one before; the agents' concurrent calls queue behind one another on the
  embedded model, so wall/floor is close to the number of agents working at once. On a server
  that batches (vLLM) the same chain bounds the time to attribution.
- load: the 1-minute load average when the run ended (other tenants of the machine).
{end_marker(NAME)}"""
