#!/usr/bin/env bash
# Where 100 % tracing's CPU goes: runs one scenario with traces off
# (--no-traces) and on (sampling 1.0), alternating, ROUNDS times each, under
# `perf record` (every process of the run: the orchestrator, its load
# generator and trace receiver, the hops and the broker), and prints CPU per
# request by process kind and thread, then the symbols that grew most, off
# against on (medians of the rounds).
#
#   bench/tracing-profile.sh [scenario.toml] [rounds] [Hz]
#       (default: bench/tracing.toml, 3, 1999)
#
# Needs perf (Debian: linux-perf) and the permission to record (root, or
# kernel.perf_event_paranoid <= 1). Uses a release build; the requests of
# the warm-up count (the profile covers the whole run).
set -euo pipefail
cd "$(dirname "$0")/.."
scenario="${1:-bench/tracing.toml}"
rounds="${2:-3}"
hz="${3:-1999}"
command -v perf >/dev/null || { echo "error: needs perf (Debian: linux-perf)" >&2; exit 1; }
cargo build --release --quiet -p tailmesh
bin=target/release/tailmesh
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
for i in $(seq "$rounds"); do
  for mode in off on; do
    flags=(); [ "$mode" = off ] && flags=(--no-traces)
    perf record -q -F "$hz" -o "$out/$mode-$i.data" -- \
      "$bin" run "$scenario" --results "$out/$mode-$i" --quiet "${flags[@]}" >/dev/null 2>"$out/$mode-$i.err" \
      || { cat "$out/$mode-$i.err" >&2; exit 1; }
    perf script -i "$out/$mode-$i.data" -F pid,tid,comm,ip,sym,dso 2>/dev/null >"$out/$mode-$i.txt"
    echo "round $i $mode: recorded"
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" "$rounds" "$hz" <<'PY'
import collections, json, pathlib, re, statistics, sys
out, rounds, hz = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
line_re = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+[0-9a-f]+\s+(.*)$")

def requests(run_dir):
    runs = sorted(p for p in run_dir.glob("*/*") if p.name != "latest")
    v = json.load(open(runs[-1] / "summary.json"))["variants"][0]
    analysis = (v.get("observer") or {}).get("analysis_cpu_us") or 0.0
    return v["sent"] + v.get("warmup", {}).get("sent", 0), analysis

def profile(mode, i):
    """CPU us per request by (process kind, thread) and by symbol."""
    n, analysis = requests(out / f"{mode}-{i}")
    rows = []
    for line in open(out / f"{mode}-{i}.txt", errors="replace"):
        m = line_re.match(line)
        if not m:
            continue
        comm, pid, tid, rest = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        # "symbol (dso)" or "[unknown] (dso)"
        sym, _, dso = rest.rpartition(" (")
        rows.append((comm, pid, tid, sym.strip() or "[unknown]", dso.rstrip(")").split("/")[-1]))
    orchestrator = min(r[1] for r in rows)
    us = 1e6 / hz / n
    threads, symbols = collections.Counter(), collections.Counter()
    for comm, pid, tid, sym, dso in rows:
        kind = "orchestrator" if pid == orchestrator else "hops+broker"
        name = "serving (main)" if tid == pid and kind == "hops+broker" else comm
        if kind == "orchestrator" and tid == pid:
            name = "main (load generator)"
        threads[(kind, name)] += us
        symbols[(kind, sym, dso)] += us
    # The traces' pass over the spool after the load runs on the main
    # thread too; the run measures it itself (observer.analysis_cpu_us).
    main = ("orchestrator", "main (load generator)")
    threads[("orchestrator", "main: analysis after")] = analysis / n
    threads[main] -= analysis / n
    return threads, symbols

def medians(counters):
    keys = set().union(*counters)
    return {k: statistics.median(c.get(k, 0.0) for c in counters) for k in keys}

res = {m: [profile(m, i) for i in range(1, rounds + 1)] for m in ("off", "on")}
th = {m: medians([t for t, _ in res[m]]) for m in res}
sy = {m: medians([s for _, s in res[m]]) for m in res}
keys = sorted(set(th["off"]) | set(th["on"]), key=lambda k: -th["on"].get(k, 0))
print(f"\nCPU per request (us), medians of {rounds} round(s), {hz:.0f} Hz sampling:")
print(f"{'process':<14} {'thread':<24} {'off':>8} {'on':>8} {'on-off':>8}")
for k in keys:
    a, b = th["off"].get(k, 0.0), th["on"].get(k, 0.0)
    print(f"{k[0]:<14} {k[1]:<24} {a:8.1f} {b:8.1f} {b - a:8.1f}")
a, b = sum(th["off"].values()), sum(th["on"].values())
print(f"{'total':<39} {a:8.1f} {b:8.1f} {b - a:8.1f}")
for kind, most in (("hops+broker", 20), ("orchestrator", 10)):
    mine = [k for k in sy["on"] if k[0] == kind]
    grew = sorted(mine, key=lambda k: -(sy["on"][k] - sy["off"].get(k, 0.0)))[:most]
    print(f"\n{kind}: symbols that grew most (us per request, on - off; self time):")
    for k in grew:
        d = sy["on"][k] - sy["off"].get(k, 0.0)
        print(f"{d:7.2f}  {k[1][:90]}  ({k[2]})")
PY
