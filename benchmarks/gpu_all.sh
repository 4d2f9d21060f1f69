#!/usr/bin/env bash
# Every GPU check this project has, in one call on a lent GPU machine (or, with --smoke, each
# one's smoke mode on a CPU, to check the script before device time is spent):
#
#   bash benchmarks/gpu_all.sh                      # on the GPU machine, from the repository root
#   bash benchmarks/gpu_all.sh --smoke              # here, first
#   bash benchmarks/gpu_all.sh gpu_sampler ...      # only the checks named (one device call
#                                                   # runs at most 10 minutes)
#
# The checks and their limits (s): gpu_sampler 400, gpu_update 400, gpu_check_exact 150 (the
# exactness checks), gpu_check 360 (the shapes' training steps), async_gpu_check 360,
# gpu_vs_trl 420, gpu_handoff 150, gpu_resume 480. Together they run past one call and past a
# lease (15 minutes): name the ones an issue needs, in two calls at most. gpu_vs_trl needs TRL:
# `bash benchmarks/gpu_wheels.sh` here, then carry .whl; this script installs it into /tmp/site.
#
# Each check has a time limit of its own, so one that hangs does not take the others' time; their
# JSON goes to benchmarks/results/ (each names the device inside), their logs to results/logs; on the
# device machine ($OUT set) everything they wrote is also packed into $OUT/gpu_all.tgz, one file,
# since only a few files come back from there. The exit status is the number of checks that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=""
[ "${1:-}" = "--smoke" ] && { SMOKE="--smoke"; shift; }
ONLY=" $* "
LOGS=benchmarks/results/logs
mkdir -p "$LOGS"
STAMP=$(mktemp)                 # what is newer than this, this run wrote
WHERE=()                        # a smoke run's JSON stays beside its logs, out of results/
[ -n "$SMOKE" ] && WHERE=(--out "$LOGS/results")
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1   # no network there: never wait on one
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "$SMOKE" ] && ls .whl/*.whl >/dev/null 2>&1; then     # carried wheels (gpu_wheels.sh)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
TRL_PYTHON="${TRL_PYTHON:-$PY}"
failed=0
run() {   # name, seconds, command...
    local name=$1 limit=$2; shift 2
    [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $name "* ]] || return 0
    local start=$SECONDS
    timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - start)) s (log: $LOGS/$name.log)"
    [ $rc -eq 0 ] || { failed=$((failed + 1)); tail -5 "$LOGS/$name.log"; }
    pack
}
pack() {   # on the device machine: what the checks wrote so far, in one file (again after each)
    [ -n "${OUT:-}" ] || return 0
    find benchmarks/results -type f -newer "$STAMP" \( -name '*.json' -o -name '*.log' -o -name '*.md' \) \
        -print0 | tar czf "$OUT/gpu_all.tgz" --null -T -
}
run gpu_sampler 400 "$PY" benchmarks/gpu_sampler.py $SMOKE "${WHERE[@]}"
run gpu_update 400 "$PY" benchmarks/gpu_update.py $SMOKE "${WHERE[@]}"
run gpu_check_exact 150 "$PY" benchmarks/gpu_check.py --part exact $SMOKE "${WHERE[@]}"
run gpu_check 360 "$PY" benchmarks/gpu_check.py --part shapes $SMOKE "${WHERE[@]}"
run async_gpu_check 360 "$PY" benchmarks/async_gpu_check.py $SMOKE "${WHERE[@]}"
run gpu_vs_trl 420 "$PY" benchmarks/gpu_vs_trl.py --trl-python "$TRL_PYTHON" $SMOKE "${WHERE[@]}"
run gpu_handoff 150 "$PY" benchmarks/gpu_handoff.py $SMOKE "${WHERE[@]}"
run gpu_resume 480 "$PY" benchmarks/gpu_resume.py $SMOKE "${WHERE[@]}"
[ -n "${OUT:-}" ] && echo "packed: \$OUT/gpu_all.tgz"
exit $failed
