#!/usr/bin/env bash
# The run recorded in this folder: the two example campaigns (CORTEX demo, trading desk) written
# into variants/, then every method over the variants with the embedded model. The cheap members
# run first over every variant, then POIROT case by case (the two systems alternated, so a run
# stopped early covers both), each followed by the ensemble combined from the four member lines
# (ensemble_of). Start it once per core: the lanes share the (case, method) pairs through the run
# directory's claims, and a rerun resumes.
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/eval-runs/2026-11-28-campaign-embedded
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$PWD

if [ "${GENERATE:-0}" = 1 ]; then
  "$PY" -m poirotd campaign run examples/campaigns/cortex_plan.yaml \
    --case examples/campaigns/cortex_demo.json --out "$OUT"
  "$PY" -m poirotd campaign run examples/campaigns/trading_plan.yaml \
    --case examples/campaigns/trading_desk.json --out "$OUT"
fi

run() {  # eval-run-args...
  "$PY" -m poirotd eval run --cases "$OUT/variants" --threads 1 --case-timeout 1800 --out "$OUT" "$@"
}

# A case's POIROT line is recorded (by this lane or another). Until it is, the ensemble would
# run all four members again instead of combining their lines: it waits for the last pass.
has_poirot_line() {  # case-id
  grep -q "\"case_id\":\"$1\",\"dataset\":\"campaign\",\"method\":\"poirot\"" "$OUT/results.jsonl"
}

mapfile -t CORTEX < <(ls "$OUT"/variants | grep '^cortex' | sed 's/\.json$//')
mapfile -t TRADING < <(ls "$OUT"/variants | grep '^trading' | sed 's/\.json$//')
IDS=()
for i in $(seq 0 $(( ${#CORTEX[@]} > ${#TRADING[@]} ? ${#CORTEX[@]} : ${#TRADING[@]} ))); do
  [ -n "${TRADING[$i]:-}" ] && IDS+=("${TRADING[$i]}")
  [ -n "${CORTEX[$i]:-}" ] && IDS+=("${CORTEX[$i]}")
done
for m in baseline errorprobe echo; do
  echo "$(date -u +%T) $m"
  run --method "$m"
done
for id in "${IDS[@]}"; do
  echo "$(date -u +%T) poirot $id"
  run --method poirot --ids "$id"
  if has_poirot_line "$id"; then
    run --method ensemble --ids "$id"
  fi
done
for id in "${IDS[@]}"; do
  if has_poirot_line "$id"; then
    run --method ensemble --ids "$id"
  fi
done
echo "$(date -u +%T) lane done"
