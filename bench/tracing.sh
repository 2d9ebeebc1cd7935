#!/usr/bin/env bash
# The cost of 100 % tracing: runs one scenario with traces off
# (--no-traces) and on (sampling 1.0), alternating, ROUNDS times each, and
# prints throughput and p50 per run and the ratios of the medians.
#
#   bench/tracing.sh [scenario.toml] [rounds]    (default: bench/tracing.toml, 3)
#
# Uses a release build; results go to a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario="${1:-bench/tracing.toml}"
rounds="${2:-3}"
cargo build --release --quiet -p tailmesh
bin=target/release/tailmesh
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

measure() { # $1 = label, rest = extra flags; prints "ok_rate p50_us"
  local label="$1"; shift
  "$bin" run "$scenario" --results "$out/$label" --quiet "$@" >/dev/null
  python3 - "$out/$label" <<'PY'
import json, pathlib, sys
runs = sorted(p for p in pathlib.Path(sys.argv[1]).glob("*/*") if p.name != "latest")
v = json.load(open(runs[-1] / "summary.json"))["variants"][0]
assert v["ok"] == v["sent"], f"{v['sent'] - v['ok']} request(s) failed"
print(v["ok_rate"], v["latency"]["p50_us"])
PY
}

# The ratios hold only on a quiet machine: the load average (1, 5, 15 min)
# before the runs (after the build) and after them.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
off=(); on=()
for i in $(seq "$rounds"); do
  read -r r p < <(measure off --no-traces); off+=("$r $p")
  printf 'round %s  off: %8.1f req/s  p50 %6d us\n' "$i" "$r" "$p"
  read -r r p < <(measure on); on+=("$r $p")
  printf 'round %s  on:  %8.1f req/s  p50 %6d us\n' "$i" "$r" "$p"
done

python3 - "${off[@]}" -- "${on[@]}" <<'PY'
import statistics, sys
args = sys.argv[1:]
cut = args.index("--")
def parse(xs): return [tuple(map(float, x.split())) for x in xs]
off, on = parse(args[:cut]), parse(args[cut + 1:])
med = lambda xs, i: statistics.median(x[i] for x in xs)
tput = med(on, 0) / med(off, 0)
p50 = med(on, 1) / med(off, 1)
print(f"median throughput: off {med(off, 0):.1f}/s, on {med(on, 0):.1f}/s -> ratio on/off {tput:.3f}")
print(f"median p50:        off {med(off, 1):.0f}us, on {med(on, 1):.0f}us -> ratio on/off {p50:.3f}")
PY
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
