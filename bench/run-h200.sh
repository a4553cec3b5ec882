#!/bin/bash
# The benchmark matrix (docs/benchmarks.md), for the H200 machine: one JSON file per run,
# a log with every table, and machine.txt, in one folder. About 4-6 minutes,
# never more than LIMIT_S seconds: a run gets at most the time left (and 240 s),
# none starts with less than 20 s left (it is logged as skipped).
#
#   bench/run-h200.sh [OUT_DIR]           OUT_DIR defaults to $OUT
#
# Environment:
#   BUILD=build-gpu    build folder holding bench/dormant-bench and bench/probe-vmm
#   BACKEND=cuda       cuda on the GPU machine; host only to try the script
#   LIMIT_S=540        the whole script's time limit (BUDGET_S: the same)
#   QUICK=1            memory sizes / 256 (16 GiB -> 64 MiB; chunk sizes stay,
#                      count-10000 is left out): checks the script itself in
#                      seconds, on any machine (with BACKEND=host)
#
# Then: /usr/bin/python3 bench/report.py OUT_DIR --update docs/benchmarks.md
#
# Runs, in order of importance (the targets first, the largest last):
#   target-retain, target-release   16 GiB kept + 16 GiB discarded, 11 cycles
#   discard-only                    16 GiB discarded only, 11 cycles
#   chunk-64MiB ... chunk-4GiB      discard-only 16 GiB by chunk size
#   probe-vmm                       create/map/unmap/release by chunk, threads
#   count-1 ... count-10000         16 + 16 GiB in N + N tensors, retain
#   size-1GiB ... size-64GiB        N + N GiB, retain (64 GiB needs 64 GiB pinned)
set -uo pipefail
cd "$(dirname "$0")/.."

build=${BUILD:-build-gpu}
backend=${BACKEND:-cuda}
limit_s=${LIMIT_S:-${BUDGET_S:-540}}
quick=${QUICK:-0}
out=${1:-${OUT:-}}
if [ -z "$out" ]; then
	echo "usage: $0 OUT_DIR (or set OUT)" >&2
	exit 2
fi
bench=$build/bench/dormant-bench
probe=$build/bench/probe-vmm
for program in "$bench" "$probe"; do
	if [ ! -x "$program" ]; then
		echo "$0: $program is missing: meson setup $build && meson compile -C $build" >&2
		exit 2
	fi
done
mkdir -p "$out"
log=$out/run-h200.log
: >"$log"
start_s=$SECONDS
failed=0
summary=()

# A size in GiB, or that many times 4 MiB when QUICK=1.
gib() {
	if [ "$quick" = 1 ]; then echo "$(($1 * 4))MiB"; else echo "${1}GiB"; fi
}

say() {
	echo "$*" | tee -a "$log"
}

# run LABEL PROGRAM ARGS...: one measurement, its JSON in OUT_DIR/LABEL.json.
run() {
	local label=$1 program=$2 t0 rc left
	shift 2
	left=$((limit_s - (SECONDS - start_s)))
	if [ "$left" -lt 20 ]; then
		say "== $label: skipped: ${left} s left of the ${limit_s} s limit"
		summary+=("$label skipped (time limit)")
		return
	fi
	[ "$left" -gt 240 ] && left=240
	say "== $label: $program $*"
	t0=$SECONDS
	timeout "$left" "$program" --backend "$backend" --label "$label" \
		--json-out "$out/$label.json" "$@" >>"$log" 2>&1
	rc=$?
	case $rc in
	0) summary+=("$label ok ($((SECONDS - t0)) s)") ;;
	77) summary+=("$label skipped (does not fit, see the log)") ;;
	124) summary+=("$label FAILED: timed out after $left s"); failed=1 ;;
	*) summary+=("$label FAILED: exit status $rc"); failed=1 ;;
	esac
	say "-- $label: exit status $rc after $((SECONDS - t0)) s"
}

{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- core bench 2>/dev/null || echo ' (core/ or bench/ modified)')"
	echo "kernel: $(uname -r)"
	echo "cpus: $(nproc)"
	grep -E '^(MemTotal|MemAvailable)' /proc/meminfo
	grep -m1 'model name' /proc/cpuinfo
	echo "transparent hugepages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
	fi
	echo "backend: $backend; quick: $quick; time limit: $limit_s s"
} >"$out/machine.txt" 2>&1
say "machine:"
sed 's/^/  /' "$out/machine.txt" | tee -a "$log"

keep16=(--keep "$(gib 16)" --discard "$(gib 16)")

# (a) the targets: medians of 10 warm cycles.
run target-retain "$bench" "${keep16[@]}" --host-mode retain --cycles 11
run target-release "$bench" "${keep16[@]}" --host-mode release --cycles 11
# (b) discard only: sleep releases, wake maps and zero-fills.
run discard-only "$bench" --keep 0 --discard "$(gib 16)" --host-mode release --cycles 11
# (e) discard release by chunk size.
for chunk in 64MiB 256MiB 1GiB 4GiB; do
	run "chunk-$chunk" "$bench" --keep 0 --discard "$(gib 16)" --chunk "$chunk" \
		--host-mode release --cycles 11
done
# The device's own costs, to tell how far discard release can go.
if [ "$quick" = 1 ]; then
	run probe-vmm "$probe" --size "$(gib 16)" --reps 1 --overlap "$(gib 4)"
else
	run probe-vmm "$probe" --size 16GiB --reps 3 --overlap 4GiB
fi
# (d) scaling by allocation count, over 16 + 16 GiB.
for n in 1 10 100 1000 10000; do
	# On the host backend each tensor maps at least 2 MiB of real memory.
	if [ "$quick" = 1 ] && [ "$n" -gt 1000 ]; then continue; fi
	run "count-$n" "$bench" "${keep16[@]}" --tensors "$n" --host-mode retain --cycles 6
done
# (c) scaling by size; 64 GiB kept in retain mode pins 64 GiB of host memory
# (dormant-bench skips a run that does not fit, with exit status 77).
for n in 1 4 16 64; do
	reps=3
	[ "$n" = 64 ] && reps=2
	run "size-${n}GiB" "$bench" --keep "$(gib "$n")" --discard "$(gib "$n")" \
		--host-mode retain --cycles 6 --ceiling-reps "$reps"
done

say ""
say "summary ($((SECONDS - start_s)) s):"
for line in "${summary[@]}"; do
	say "  $line"
done
say "JSON files and this log: $out"
exit $failed
