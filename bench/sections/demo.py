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
        f"{r.floor_seconds:.0f} s",
        f"**{_ratio(r.wall_seconds, r.floor_seconds)}**",
        f"{r.critical_path_seconds:.0f} s ({r.critical_path_calls} calls, "
        f"{r.critical_path_prompt_tokens} + {r.critical_path_completion_tokens} tokens)",
        f"{_ratio(r.wall_seconds, r.critical_path_seconds)}",
        f"{r.prefill_tokens_per_second:.0f} / {r.decode_tokens_per_second:.1f} / "
        f"{r.per_call_seconds:.1f}",
        f"{r.load_average:.1f}",
    )
    return "| " + " | ".join(cells) + " |"


def render(runs: Sequence[DemoRun]) -> str:
    columns = (
        "started (UTC)", "commit", "state", "calls", "wall", "model busy", "floor",
        "wall/floor", "critical path", "wall/critical path",
        "prefill, decode tok/s / s a call", "load",
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

- **floor**: every call of the run end to end, each costed at the prefill and decode speeds and
  the cost a call has whatever its tokens that the run's own calls showed (a least-squares fit
  over their service times; the last column): the embedded backend
  serves one call at a time, so no scheduling of these calls finishes sooner. **wall/floor** is
  what poirotd adds to the model's own time (scheduling, parsing, the store, the gRPC events):
  the issue's goal is at most 1.1x.
- **critical path**: the longest chain of calls each waiting for the one before, at the same
  speeds. The agents' concurrent calls queue behind one another on the embedded model, so
  wall/critical path is about the number of agents working at once; on a server that runs them
  side by side (vLLM) this chain bounds the time to attribution.
- **model busy**: the union of the calls' intervals, measured (not fitted).
- load: the 1-minute load average when the run ended (other tenants of the machine).
{end_marker(NAME)}"""
