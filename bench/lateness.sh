#!/usr/bin/env bash
# The load generator's lateness (start - intended send time) at 1000/s open
# loop, for each pacing strategy, alternating, ROUNDS times each: by default
# the generator's own alarm alone (plain), the alarm plus a spin of the last
# microseconds (nort), then real-time priority (rt, the default pacing),
# then the generator's thread pinned to CPU 0, then the default on the
# process's shared timer thread instead of the alarm. Prints p50 / p99 /
# p99.9 per run, the medians per strategy, and the machine's state (CPU
# pressure, load) as the self-watch saw it during each run.
#
#   bench/lateness.sh [rounds [strategy ...]]   (default 3 rounds, the five)
#
# Uses a release build; results go to a temporary folder. TAILMESH_PACING
# selects the strategy (see orchestrator/src/loadgen/pacing.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
shift || true
cargo build --release --quiet -p tailmesh
bin=target/release/tailmesh
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

strategies=("plain" "nort" "rt" "rt,pin=0" "shared-timer")
if [ "$#" -gt 0 ]; then strategies=("$@"); fi
measure() { # $1 = strategy; prints "p50 p99 p99.9 pressure load"
  local label="${1//[,=]/_}"
  TAILMESH_PACING="$1" "$bin" run bench/lateness.toml --results "$out/$label" --quiet >/dev/null || true
  python3 - "$out/$label" <<'PY'
import json, pathlib, sys
runs = sorted(p for p in pathlib.Path(sys.argv[1]).glob("*/*") if p.name != "latest")
v = json.load(open(runs[-1] / "summary.json"))["variants"][0]
l, i = v["lateness"], v.get("instrument") or {}
print(l["p50_us"], l["p99_us"], l["p99_9_us"],
      round(100 * (i.get("cpu_pressure") or 0)), (i.get("load_average") or [0, 0, 0])[2])
PY
}

results=()
for r in $(seq "$rounds"); do
  for s in "${strategies[@]}"; do
    read -r p50 p99 p999 pressure load < <(measure "$s")
    printf 'round %s  %-10s lateness p50 %6s us  p99 %6s us  p99.9 %6s us  (CPU pressure %s %%, load %s)\n' \
      "$r" "$s" "$p50" "$p99" "$p999" "$pressure" "$load"
    results+=("$s $p50 $p99 $p999")
  done
done

python3 - "${results[@]}" <<'PY'
import statistics, sys
by = {}
for row in sys.argv[1:]:
    s, *v = row.split()
    by.setdefault(s, []).append(list(map(int, v)))
for s, rows in by.items():
    med = [statistics.median(r[i] for r in rows) for i in range(3)]
    print(f"median {s:<10} p50 {med[0]:6.0f} us  p99 {med[1]:6.0f} us  p99.9 {med[2]:6.0f} us")
PY
