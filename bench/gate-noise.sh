#!/usr/bin/env bash
# Run-to-run noise of one scenario with one seed, for the default
# tolerance of `tailmesh compare --gate`: runs the scenario RUNS times and
# prints each run's p50 and p99 and, over all pairs of runs, the spread of
# their ratios and of the error share difference, per variant, with the
# tolerance that noise suggests. Either run of a pair could be the
# baseline, so a pair's deviation is max(B/A, A/B) - 1; the suggestion is
# 1.5 x the 95th percentile of that, p50's or p99's, the larger, rounded up
# to 5 %.
#
#   bench/gate-noise.sh [--runs N] [--duration D] [scenario.toml]
#       (default: 10 runs of scenarios/default.toml, its own duration)
#
# --duration replaces [load] duration (e.g. 3s to try the script quickly).
# Uses a release build (or the binary TAILMESH_BIN names, built already);
# results go to a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=10
duration=""
scenario="scenarios/default.toml"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) scenario="$1"; shift ;;
  esac
done
[ "$runs" -ge 2 ] || { echo "--runs must be 2 or more" >&2; exit 2; }
bin="${TAILMESH_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --quiet -p tailmesh
  bin=target/release/tailmesh
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

if [ -n "$duration" ]; then
  python3 bench/lib/set-duration.py "$scenario" "$duration" "$out/scenario.toml"
  scenario="$out/scenario.toml"
fi

# The numbers hold only on a quiet machine: the load average (1, 5, 15 min)
# before the runs (after the build) and after them.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
for i in $(seq "$runs"); do
  "$bin" run "$scenario" --results "$out/run-$i" --quiet >/dev/null
  echo "run $i of $runs done"
done

python3 - "$out" "$runs" <<'PY'
import itertools, json, math, pathlib, sys
out, runs = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def summary(i):
    dirs = sorted(p for p in (out / f"run-{i}").glob("*/*") if p.name != "latest")
    return json.load(open(dirs[-1] / "summary.json"))
summaries = [summary(i) for i in range(1, runs + 1)]
def pct(xs, q):  # nearest rank
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]
worst = []
for name in [v["name"] for v in summaries[0]["variants"]]:
    vs = [next(v for v in s["variants"] if v["name"] == name) for s in summaries]
    share = lambda v: (sum(v["errors"].values()) + v["timeouts"]) / max(v["sent"], 1)
    print(f"variant {name}: ok per run {min(v['ok'] for v in vs)}..{max(v['ok'] for v in vs)}")
    for metric in ["p50_us", "p99_us"]:
        values = [v["latency"][metric] for v in vs]
        dev = [max(b / a, a / b) - 1 for a, b in itertools.combinations(values, 2)]
        worst.append(pct(dev, 0.95))
        print(f"  {metric[:-3]} per run (us): {' '.join(map(str, values))}")
        print(f"  {metric[:-3]}: max(B/A, A/B) - 1 over {len(dev)} pairs: median "
              f"{pct(dev, 0.5):.1%}, 95th pct {pct(dev, 0.95):.1%}, max {max(dev):.1%}")
    diff = [abs(share(b) - share(a)) for a, b in itertools.combinations(vs, 2)]
    print(f"  error share: |B - A| median {pct(diff, 0.5):.2%} points, "
          f"max {max(diff):.2%} points")
suggested = math.ceil(1.5 * max(worst) * 20 - 1e-9) / 20
print(f"suggested tolerance (1.5 x the larger 95th pct, rounded up to 5 %): {suggested:.0%}")
PY
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
