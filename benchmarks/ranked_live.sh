#!/usr/bin/env bash
# The GPU steps that judge the ranked sampler live, one device call per step
# (benchmarks/RESULTS.md §7):
#
#   OUT=... bash benchmarks/ranked_live.sh models  # the cost model's 16 first choices added to the
#                                                  # device's matmul files, those within 8% re-timed
#   OUT=... bash benchmarks/ranked_live.sh shapes  # ground truth at 64x4096x4096, 512x14336x4096
#   OUT=... bash benchmarks/ranked_live.sh live    # a job (JOB) cold at SEEDS, then warm at the first
#   # (the ground truth stored first; WARM_FROM="NVIDIA H200": that device's results only, §20)
#
# Each step works in a scratch folder, runs its commands one after another under `timeout` with
# what is left of BUDGET_S (560 s: one device call), and after every command packs
# $OUT/ranked_live_<step>.tgz (the files, each command's <name>.log or .jsonl, <name>.err, and
# steps.txt with exit statuses and seconds), so a call cut short still returns what it measured.
#
# DEVICE=fake: the fake device on the CPU, to test it (the live step's jobs run with --dry-run).
# Settings (environment): DATA (per-shape ground-truth files to copy; default the device's
# packaged ones, unpacked), ESTIMATED (16), GT_SECONDS (models: --seconds per file, 60), RETIME (0.08),
# RETIME_MAX (models 128; shapes: ground_truth.py's default), ROUNDS (5), MAX (600), CLIMB (3),
# SHAPE_SECONDS (120), SHAPES ("m=64,n=4096,k=4096 m=512,n=14336,k=4096"), JOB
# (examples/unseen_shapes_2.toml), SEEDS ("0 1 2"), TRIALS (live: --trials, default the job's),
# WARM_FROM (live: another device whose packaged results the warm run stores instead),
# WORK (the scratch folder, default a new one under /tmp), PYTHON (python3), GPU_NAME (default:
# nvidia-smi's name of the GPU; it picks the device's own ground truth when DATA is not set; the
# fake device stands in for "NVIDIA H200").
set -u

STEP=${1:-}
case "$STEP" in
  models|shapes|live) ;;
  *) echo "usage: OUT=DIR [DEVICE=gpu|fake] bash benchmarks/ranked_live.sh models|shapes|live" >&2; exit 2 ;;
esac
: "${OUT:?set OUT to the folder the results are packed into}"
DEVICE=${DEVICE:-gpu}
case "$DEVICE" in
  gpu|fake) ;;
  *) echo "ranked_live.sh: DEVICE must be gpu or fake, got '$DEVICE'" >&2; exit 2 ;;
esac
# Any GPU: the step works on that device's own ground truth (autotune/replay/data/<device>/),
# never on another device's; ground_truth.py refuses to extend a file of another device.
GPU_NAME=${GPU_NAME:-}
if [[ $DEVICE == gpu && -z $GPU_NAME ]]; then
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  if [[ -z $GPU_NAME ]]; then
    echo "ranked_live.sh: no GPU found (nvidia-smi); DEVICE=fake runs it on the CPU" >&2
    exit 2
  fi
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-560}
DEADLINE=$(( $(date +%s) + BUDGET_S ))
WORK=${WORK:-$(mktemp -d /tmp/ranked_live.XXXXXX)}
if [[ -z ${DATA:-} ]]; then
  DATA=$WORK/ground_truth
  "$PY" benchmarks/pack_ground_truth.py --unpack "${GPU_NAME:-NVIDIA H200}" "$DATA" > /dev/null 2>&1
fi
if ! compgen -G "$DATA/hopper_matmul__*.json" > /dev/null; then
  echo "ranked_live.sh: no ground truth of ${GPU_NAME:-this device} in $DATA: record it first with benchmarks/ground_truth.py (--out auto)" >&2
  exit 2
fi
W=$WORK/$STEP
mkdir -p "$W" "$OUT"
FAILED=0

pack() {
  tar czf "$OUT/ranked_live_$STEP.tgz.partial" -C "$WORK" "$STEP" && mv "$OUT/ranked_live_$STEP.tgz.partial" "$OUT/ranked_live_$STEP.tgz"
}

# run NAME COMMAND...: stdout to $W/NAME.log (to $W/NAME where NAME has an extension), stderr
# to $W/NAME.err, under what is left of the budget; then packs.
run() {
  local name=$1; shift
  local log=$W/$name
  [[ $name == *.* ]] || log=$log.log
  local left=$(( DEADLINE - $(date +%s) )) start rc
  if (( left < 5 )); then
    echo "== $name: skipped, the step's budget of $BUDGET_S s is spent" | tee -a "$W/steps.txt"
    FAILED=1
    return
  fi
  echo "== $name (at most $left s): $*"
  start=$(date +%s)
  timeout --kill-after=15 "$left" "$@" > "$log" 2> "$W/$name.err"
  rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - start )) s: $*" >> "$W/steps.txt"
  tail -n 8 "$log"
  (( rc == 0 )) || { FAILED=1; echo "== $name: exit $rc (124: out of time); last errors:"; tail -n 5 "$W/$name.err"; }
  pack
}

GT=("$PY" benchmarks/ground_truth.py --device "$DEVICE")
case "$STEP" in
  models)
    cp "$DATA"/hopper_matmul__*.json "$W"/ || exit 2
    FILES=("$W"/hopper_matmul__*.json)
    run models_estimated "${GT[@]}" --files "${FILES[@]}" --max 0 --estimated "${ESTIMATED:-16}" \
      --seconds "${GT_SECONDS:-60}"
    run models_retime "${GT[@]}" --files "${FILES[@]}" --max 0 --retime "${RETIME:-0.08}" \
      --retime-max "${RETIME_MAX:-128}" --rounds "${ROUNDS:-5}"
    ;;
  shapes)
    for shape in ${SHAPES:-m=64,n=4096,k=4096 m=512,n=14336,k=4096}; do
      run "shapes_${shape//[=,]/_}" "${GT[@]}" --kernel hopper_matmul --shape "$shape" --out "$W" \
        --max "${MAX:-600}" --climb "${CLIMB:-3}" --estimated "${ESTIMATED:-16}" \
        --seconds "${SHAPE_SECONDS:-120}" --retime "${RETIME:-0.08}" --rounds "${ROUNDS:-5}" \
        ${RETIME_MAX:+--retime-max "$RETIME_MAX"}
    done
    ;;
  live)
    JOB=${JOB:-examples/unseen_shapes_2.toml}
    TUNE=("$PY" -m autotune tune --jsonl --results-dir "$WORK/results" ${TRIALS:+--trials "$TRIALS"})
    [[ $DEVICE == fake ]] && TUNE+=(--dry-run)
    for seed in ${SEEDS:-0 1 2}; do
      sed "s/^seed = .*/seed = $seed/" "$JOB" > "$W/job_s$seed.toml"
    done
    first=$(set -- ${SEEDS:-0 1 2}; echo "$1")
    for seed in ${SEEDS:-0 1 2}; do
      run "cold_s$seed.jsonl" "${TUNE[@]}" --db "sqlite:///$W/cold_s$seed.db" "$W/job_s$seed.toml"
      run "cold_s${seed}_live" "$PY" benchmarks/search_efficiency.py --live "sqlite:///$W/cold_s$seed.db" \
        --job "$W/job_s$seed.toml"
    done
    if [[ -n ${WARM_FROM:-} ]]; then  # another device's packaged ground truth and live results
      run warm_store "$PY" benchmarks/search_efficiency.py --store-ground-truth "sqlite:///$W/warm_s$first.db" \
        --device "$WARM_FROM" --kernel hopper_matmul
    else
      run warm_store "$PY" benchmarks/search_efficiency.py --store-ground-truth "sqlite:///$W/warm_s$first.db" \
        "$DATA"/*__*__*.json
    fi
    run "warm_s$first.jsonl" "${TUNE[@]}" --db "sqlite:///$W/warm_s$first.db" "$W/job_s$first.toml"
    run "warm_s${first}_live" "$PY" benchmarks/search_efficiency.py --live "sqlite:///$W/warm_s$first.db" \
      --job "$W/job_s$first.toml"
    ;;
esac
pack
echo "== packed $OUT/ranked_live_$STEP.tgz"
cat "$W/steps.txt"
exit $FAILED
