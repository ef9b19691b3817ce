"""Every attribution method over every benchmark, against one OpenAI-compatible server (vLLM).

`make bench-gpu VLLM_URL=http://host:8000/v1 MODEL=name` runs poirot, baseline, echo, errorprobe
and ensemble over Who&When (both subsets), BLAME (both systems) and TracerTraj through
`poirotd eval run`, one run directory per dataset and method under
bench/eval-runs/<date>-<model>/, each scored by `poirotd eval report` (results.jsonl, report,
figures), beside facts.json: what the server says of itself (/v1/models, /version) and the GPU
when the caller names it. Then bench.tta runs poirotd's engine and poirot-framework side by
side on the same server and Who&When cases (time to attribution, calls, tokens, poirotd's
critical path), into tta/. Invoked again with the same --out it resumes: `poirotd eval run`
skips the cases its results.jsonl already holds and bench.tta the cases its runs.json holds, so
only unfinished cases run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "bench" / "eval-runs"
METHODS = ("poirot", "baseline", "echo", "errorprobe", "ensemble")
# Each dataset run: its directory name and the `poirotd eval run` arguments that select it.
DATASETS: dict[str, tuple[str, ...]] = {
    "whowhen-algorithm-generated": ("--dataset", "whowhen", "--subset", "algorithm-generated"),
    "whowhen-hand-crafted": ("--dataset", "whowhen", "--subset", "hand-crafted"),
    "blame-cortex": ("--dataset", "blame-cortex"),
    "blame-trading": ("--dataset", "blame-trading"),
    "tracertraj": ("--dataset", "tracertraj"),
}
FACTS_TIMEOUT_S = 10.0


def run_folder(model: str, when: datetime) -> Path:
    """bench/eval-runs/<date>-<model>, the model's name made safe for a path."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-")
    return RUNS / f"{when:%Y-%m-%d}-{safe}"


def _get_json(url: str) -> Any:
    """The JSON at `url`, or what went wrong as {"error": ...}: a fact the server does not
    offer is written down as missing, it does not stop the benchmark."""
    try:
        with urllib.request.urlopen(url, timeout=FACTS_TIMEOUT_S) as answer:
            return json.load(answer)
    except (OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def server_facts(base_url: str, model: str, gpu: str) -> dict[str, Any]:
    """What the server says of itself. vLLM serves /version at its root, beside /v1; a GPU is
    not something it reports over HTTP, hence `gpu` (e.g. nvidia-smi's name of it)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return {
        "base_url": base_url,
        "model": model,
        "gpu": gpu or "not given (--gpu)",
        "models": _get_json(f"{base_url.rstrip('/')}/models"),
        "version": _get_json(f"{root}/version"),
        "recorded_at": datetime.now(UTC).isoformat(),
    }


# The run directory of a fault campaign's cases (--cases-folder), beside the datasets'.
CAMPAIGN = "campaign"
# The run directory of bench.tta's comparison with poirot-framework.
TTA = "tta"


def eval_command(dataset: str, method: str, out: Path, args: argparse.Namespace) -> list[str]:
    """`dataset`: a DATASETS key, or CAMPAIGN for the one-case files of --cases-folder (read by
    `poirotd eval run --cases`, which `poirotd campaign` writes its cases for)."""
    selected = ("--cases", str(args.cases_folder)) if dataset == CAMPAIGN else DATASETS[dataset]
    command = [
        sys.executable, "-m", "poirotd", "eval", "run",
        *selected,
        "--method", method,
        "--out", str(out),
        "--data-dir", str(args.data),
        "--base-url", args.base_url,
        "--model", args.model,
        "--structured-output", args.structured_output,
        "--concurrency", str(args.concurrency),
    ]  # fmt: skip
    if args.limit:
        command += ["--limit", str(args.limit)]
    if args.case_timeout:
        command += ["--case-timeout", str(args.case_timeout)]
    return command


def tta_command(out: Path, args: argparse.Namespace) -> list[str]:
    """bench.tta against the same server, its runs and section kept in the run folder."""
    command = [
        sys.executable, "-m", "bench.tta",
        "--data", str(args.data),
        "--server", args.base_url,
        "--model", args.model,
        "--context-tokens", str(args.context_tokens),
        "--runs", str(out / "runs.json"),
        "--report", str(out / "report.md"),
        "--sides", *args.tta_sides,
    ]  # fmt: skip
    if args.tta_cases:
        command += ["--cases", *args.tta_cases]
    return command


def run_all(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """Each dataset and method run (resumed where its results stop) and scored, then the time
    to attribution beside poirot-framework; returns (dataset, method, exit code) per run. A run
    that fails does not stop the others."""
    args.out.mkdir(parents=True, exist_ok=True)
    facts = server_facts(args.base_url, args.model, args.gpu)
    (args.out / "facts.json").write_text(json.dumps(facts, indent=1) + "\n")
    ran = []
    for dataset in [*args.datasets, *([CAMPAIGN] if args.cases_folder else [])]:
        for method in args.methods:
            out = args.out / dataset / method
            print(f"== {dataset} / {method} -> {out}", flush=True)
            code = subprocess.run(eval_command(dataset, method, out, args), check=False)
            if code.returncode == 0:
                scored = [sys.executable, "-m", "poirotd", "eval", "report", str(out)]
                code = subprocess.run(scored, check=False)
            ran.append((dataset, method, code.returncode))
    if args.tta_sides:
        out = args.out / TTA
        out.mkdir(exist_ok=True)
        print(f"== time to attribution ({', '.join(args.tta_sides)}) -> {out}", flush=True)
        code = subprocess.run(tta_command(out, args), check=False)
        ran.append((TTA, "/".join(args.tta_sides), code.returncode))
    (args.out / "index.md").write_text(index(args, ran))
    return ran


def index(args: argparse.Namespace, ran: Sequence[tuple[str, str, int]]) -> str:
    """The run folder's front page: where each dataset and method's report is."""
    lines = [
        f"# poirotd over every benchmark: {args.model}",
        "",
        f"Server {args.base_url}; its facts in [facts.json](facts.json).",
        "",
        "| dataset | method | run | exit |",
        "| --- | --- | --- | ---: |",
    ]
    for dataset, method, code in ran:
        where = f"{TTA}/report.md" if dataset == TTA else f"{dataset}/{method}"
        lines.append(f"| {dataset} | {method} | [{where}]({where}) | {code} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server's /v1 URL")
    parser.add_argument("--model", required=True, help="the served model's name")
    parser.add_argument(
        "--data",
        type=Path,
        default=os.environ.get("POIROTD_EVAL_DATA"),
        help="the data folder holding blame/, whowhen/, tracertraj/ (default: POIROTD_EVAL_DATA)",
    )
    parser.add_argument(
        "--out", type=Path, help="run folder (default: bench/eval-runs/<date>-<model>); resumed"
    )
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--concurrency", type=int, default=8, help="cases at once per run")
    parser.add_argument("--limit", type=int, default=0, help="at most this many cases per run")
    parser.add_argument("--case-timeout", type=float, default=0.0, help="seconds per case")
    parser.add_argument(
        "--structured-output",
        choices=("json_schema", "json_object"),
        default="json_schema",
        help="json_schema for vLLM, json_object for llama.cpp's server",
    )
    parser.add_argument(
        "--cases-folder",
        type=Path,
        help="also run a fault campaign's cases (one-case JSON files, `poirotd campaign`)",
    )
    parser.add_argument("--gpu", default="", help="the GPU, as nvidia-smi names it")
    parser.add_argument(
        "--tta-sides",
        nargs="*",
        choices=("poirotd", "library"),
        default=["poirotd", "library"],
        help="bench.tta's sides (poirot-framework is the library); none: skip it",
    )
    parser.add_argument("--tta-cases", nargs="+", help="bench.tta's Who&When cases")
    parser.add_argument(
        "--context-tokens", type=int, default=32768, help="the served model's context (tta)"
    )
    args = parser.parse_args(argv)
    if args.data is None:
        parser.error("--data (or POIROTD_EVAL_DATA): the data folder")
    args.out = args.out or run_folder(args.model, datetime.now(UTC))
    ran = run_all(args)
    print(f"results under {args.out}", flush=True)
    return max((code for _, _, code in ran), default=0)


if __name__ == "__main__":
    sys.exit(main())
