#!/usr/bin/env bash
# The run recorded in this folder: every method on 10 Who&When Algorithm-Generated cases and the
# 8 Hand-Crafted ones, case by case (AG and HC interleaved), the four member methods each as its
# own `poirotd eval run`, then the ensemble combined from their lines (ensemble_of). Start it once
# per core: the lanes share the (case, method) pairs through the run directory's claims, and a
# rerun skips what results.jsonl already holds. AG_CASES / HC_CASES (space-separated ids, may be
# empty) replace the case lists, e.g. to resume only the Hand-Crafted cases.
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/eval-runs/whowhen-all-methods-smollm2
PY=${PY:-/work/main/.venv/bin/python}
# The data folder holding whowhen/ (README.md, "Evaluation on public benchmarks").
DATA=${DATA:-${POIROTD_EVAL_DATA:?name the data folder holding whowhen/ in POIROTD_EVAL_DATA}}
read -ra AG <<< "${AG_CASES-38 93 19 47 12 73 58 66 30 81}"
read -ra HC <<< "${HC_CASES-12 45 53 1 3 44 51 56}"
MEMBERS=(baseline echo errorprobe poirot)

run() {  # dataset-args... -- method id
  "$PY" -m poirotd eval run "$@" --data-dir "$DATA" --threads 1 --case-timeout 5400 --out "$OUT"
}

ensembles() {  # combines the ensemble of every case whose four members are recorded
  "$PY" - "$OUT/results.jsonl" <<'PYEOF' | while read -r ds ids; do
import json, sys
from collections import defaultdict
last = defaultdict(dict)
errors = defaultdict(list)
try:
    lines = open(sys.argv[1]).read().splitlines()
except FileNotFoundError:
    lines = []
for text in lines:
    try:
        line = json.loads(text)
    except json.JSONDecodeError:
        continue
    last[(line["dataset"], line["case_id"])][line["method"]] = line["status"]
    errors[(line["dataset"], line["case_id"])].append(line.get("error", ""))
ready = defaultdict(list)
for (dataset, case), status in last.items():
    members = [status.get(m) for m in ("poirot", "baseline", "echo", "errorprobe")]
    crashed = any(e.startswith("internal error") for e in errors[(dataset, case)])
    if "ensemble" not in status and not crashed and all(s in ("ok", "failed", "context_exceeded") for s in members):
        ready[dataset].append(case)
for dataset, cases in ready.items():
    print(dataset, ",".join(cases))
PYEOF
    if [ "$ds" = whowhen ]; then sel=(--dataset whowhen); else sel=(--dataset whowhen --subset hand-crafted); fi
    run "${sel[@]}" --method ensemble --ids "$ids"
  done
}

for i in $(seq 0 9); do
  for pair in "whowhen ${AG[$i]:-}" "whowhen-hand-crafted ${HC[$i]:-}"; do
    set -- $pair
    ds=$1; id=${2:-}
    [ -z "$id" ] && continue
    if [ "$ds" = whowhen ]; then sel=(--dataset whowhen); else sel=(--dataset whowhen --subset hand-crafted); fi
    for m in "${MEMBERS[@]}"; do
      echo "$(date -u +%T) $ds $id $m"
      run "${sel[@]}" --method "$m" --ids "$id"
      ensembles
    done
  done
done
echo "$(date -u +%T) lane done"
