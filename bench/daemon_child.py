"""The daemon as its own process for the memory run: ``python -m bench.daemon_child SPEC DB READY``.

A child process so that its peak RSS (VmHWM) is its own, not the benchmark's. The LLM
is the tests' scripted backend: investigations run the whole protocol and are recorded, but the
figure leaves out the model (the embedded SmolLM2 adds its weights; vLLM runs elsewhere).
Runs until SIGTERM, then drains like `poirotd run`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from poirotd.config import Settings, SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.llm.scripted import ScriptedBackend
from poirotd.observability import logs


def main() -> None:
    spec_path, db_path, ready_path = (Path(arg) for arg in sys.argv[1:4])
    logs.configure("warning", "json")
    spec = SystemSpec.model_validate_json(spec_path.read_text())
    settings = Settings(db_path=db_path, grpc_port=0, metrics_port=0, drain_seconds=5)
    daemon = Daemon(settings, spec, backend=ScriptedBackend(schema_answer))
    asyncio.run(daemon.run_until_signalled(ready_path))


if __name__ == "__main__":
    main()
