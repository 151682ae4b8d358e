#!/usr/bin/env bash
# Run a test RUNS times under deliberate CPU contention: LOOPS busy-loop processes beside it (the
# machine's cores all busy), as a CI machine shared with other jobs is. Prints one line per run.
#   bash scripts/under-load.sh RUNS LOOPS PYTEST_ARGS...
#   bash scripts/under-load.sh 10 3 tests/distributed/test_bench_migration.py
set -u
runs=$1 loops=$2; shift 2
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 RAY_AUTH_MODE=disabled
out=$(mktemp -d /tmp/under-load.XXXX)
pids=()
for _ in $(seq 1 "$loops"); do python3 -c "while True: pass" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
passed=0
for i in $(seq 1 "$runs"); do
  t0=$(date +%s)
  python -m pytest -q -p no:randomly --basetemp="$out/run$i" "$@" > "$out/run$i.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && passed=$((passed + 1))
  echo "run $i: rc=$rc, $(( $(date +%s) - t0 )) s, $(tail -1 "$out/run$i.log")"
done
echo "$passed of $runs passed under $loops busy loops (logs and pytest's tmp folders: $out)"
