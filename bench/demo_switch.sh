#!/bin/bash
# Time the README demo's sleeps and wakes: dormantd on the simulated device
# (host backend) with 1 GiB kept and 1 GiB discarded, three cycles, each
# report's duration and host_prep/map phases, and the process's CPU seconds.
#   bench/demo_switch.sh [BUILD_DIR] [dormantd options...]
# e.g. bench/demo_switch.sh build --host-mode reclaimable
set -eu
build=${1:-build}
shift || true
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
"$build/tools/dormantd" --listen 127.0.0.1:0 --port-file "$dir/port" --backend host \
	--keep 1GiB --discard 1GiB --quiet "$@" &
pid=$!
for _ in $(seq 600); do [ -s "$dir/port" ] && break; sleep 0.2; done
port=$(cat "$dir/port")
for cycle in 1 2 3; do
	for op in sleep wake; do
		curl -s -X POST "127.0.0.1:$port/$op" -o "$dir/report.json"
		/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
t = d["times"]
print("%s %s: %.2f s (host_prep %.2f, map %.2f)" % (
    sys.argv[2], sys.argv[3], d["duration_s"], t["host_prep_s"], t["map_s"]))' "$dir/report.json" "$cycle" "$op"
	done
done
awk '{printf "CPU: user %.2f s, system %.2f s\n", $14 / 100, $15 / 100}' "/proc/$pid/stat"
