#!/usr/bin/env bash
# A list of measurements run in the background on the GPU machine, so one plan outlives the
# per-call time limit: start it in one call, collect what has finished in the next ones (the
# machine stays warm only briefly between calls, so poll again at once). From the repo root:
#   source .device/bootstrap.sh; bash tools/device_steps.sh start PLAN; bash tools/device_steps.sh poll 540
#   bash tools/device_steps.sh poll 540        # later calls: results so far in $OUT/res.tgz
# PLAN is a bash file of lines `step NAME COMMAND...` (T=SECONDS before one: its time limit,
# default 900); each step's output goes to /tmp/res/NAME.txt, its start and end (exit status)
# to /tmp/res/progress.txt, and `done` is written there after the last. tools/device_plan.sh
# is the plan the next measurements need.
set -uo pipefail
R=/tmp/res
case "${1:-}" in
  start)
    plan=$(realpath "$2")
    mkdir -p "$R"
    setsid nohup bash "$0" run "$plan" > "$R/runner.log" 2>&1 < /dev/null &
    ;;
  run)
    export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/nc} NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0
    export PYTHONUNBUFFERED=1
    unset NUMBA_ENABLE_CUDASIM
    step() {  # name command...
      local name=$1
      shift
      echo "start $name $(date +%T)" >> "$R/progress.txt"
      timeout "${T:-900}" "$@" > "$R/$name.txt" 2>&1
      echo "end $name rc=$? $(date +%T)" >> "$R/progress.txt"
    }
    nvidia-smi > "$R/nvidia-smi.txt" 2>&1
    # shellcheck source=/dev/null
    source "$2"
    echo done >> "$R/progress.txt"
    ;;
  poll)
    end=$((SECONDS + ${2:-500}))
    while [ $SECONDS -lt $end ] && ! grep -q '^done' "$R/progress.txt" 2>/dev/null; do sleep 5; done
    cat "$R/progress.txt" 2>/dev/null
    tar czf "${OUT:-/tmp}/res.tgz" -C /tmp res
    ;;
  *)
    echo "usage: device_steps.sh start PLAN | poll [SECONDS]" >&2
    exit 2
    ;;
esac
