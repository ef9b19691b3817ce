#!/usr/bin/env bash
# The run recorded in this folder: plan.yaml over the trading desk into variants/ (GENERATE=1),
# then every method with the embedded model. Start it once per core: the lanes share the
# (case, method) pairs through the run directory's claims. The ensemble combines the four
# members' lines; run it (`ENSEMBLE=1`) once every lane is done, or it would run the members
# whose lines another lane still holds a second time.
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/eval-runs/2026-11-28-campaign-absences
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$PWD

if [ "${GENERATE:-0}" = 1 ]; then
  "$PY" -m poirotd campaign run "$OUT/plan.yaml" --case examples/campaigns/trading_desk.json --out "$OUT"
fi
methods=(baseline errorprobe echo poirot)
[ "${ENSEMBLE:-0}" = 1 ] && methods=(ensemble)
for m in "${methods[@]}"; do
  echo "$(date -u +%T) $m"
  "$PY" -m poirotd eval run --cases "$OUT/variants" --threads 1 --case-timeout 1800 --out "$OUT" --method "$m"
done
echo "$(date -u +%T) lane done"
