#!/usr/bin/env bash
# Every GPU check this project has, in one call on a lent GPU machine (or, with --smoke, each
# one's smoke mode on a CPU, to check the script before device time is spent):
#
#   bash benchmarks/gpu_all.sh                      # on the GPU machine, from the repository root
#   bash benchmarks/gpu_all.sh --smoke              # here, first
#   bash benchmarks/gpu_all.sh gpu_sampler ...      # only the checks named (one device call
#                                                   # runs at most 10 minutes)
#
# Each check has a time limit of its own, so one that hangs does not take the others' time; their
# JSON goes to benchmarks/results/ (named by the device), their logs to $OUT (or results/logs).
# The exit status is the number of checks that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=""
[ "${1:-}" = "--smoke" ] && { SMOKE="--smoke"; shift; }
ONLY=" $* "
LOGS="${OUT:-benchmarks/results/logs}"
mkdir -p "$LOGS"
WHERE=()                        # a smoke run's JSON stays beside its logs, out of results/
[ -n "$SMOKE" ] && WHERE=(--out "$LOGS/results")
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
failed=0
run() {   # name, seconds, command...
    local name=$1 limit=$2; shift 2
    [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $name "* ]] || return 0
    local start=$SECONDS
    timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - start)) s (log: $LOGS/$name.log)"
    [ $rc -eq 0 ] || { failed=$((failed + 1)); tail -5 "$LOGS/$name.log"; }
}
run gpu_sampler 400 "$PY" benchmarks/gpu_sampler.py $SMOKE "${WHERE[@]}"
run gpu_update 400 "$PY" benchmarks/gpu_update.py $SMOKE "${WHERE[@]}"
run gpu_check 360 "$PY" benchmarks/gpu_check.py $SMOKE "${WHERE[@]}"
run async_gpu_check 360 "$PY" benchmarks/async_gpu_check.py $SMOKE "${WHERE[@]}"
exit $failed
