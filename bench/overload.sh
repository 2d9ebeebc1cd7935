#!/usr/bin/env bash
# Goodput at 2x overload per queue discipline, push and pull, with the
# memory the processes reached.
#
#   bench/overload.sh [seconds]      (measured seconds per variant, default 4)
#
# 1. Capacity: the worker of scenarios/overload.toml (5 ms per request, one
#    at a time) driven closed loop with 8 in flight, pushed and pulled: its
#    ok answers per second.
# 2. Overload: open loop at twice that capacity (per transport), 500 ms
#    timeout, each discipline (fifo, lifo, adaptive) in turn.
# Prints, per variant: goodput (ok/s) and goodput / capacity, p99 of the
# answered requests, the share that failed, and the peak resident memory
# (VmHWM) of the broker, of each hop process and of the orchestrator,
# sampled from /proc while the variant runs. Uses a release build; results
# go to a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-4}"
cargo build --release --quiet -p tailmesh
export TAILMESH_BIN="$PWD/target/release/tailmesh" SECONDS_PER_VARIANT="$seconds"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OUT="$out"

python3 - <<'PY'
import json, os, pathlib, subprocess, time

BIN, OUT = os.environ["TAILMESH_BIN"], pathlib.Path(os.environ["OUT"])
SECS = os.environ["SECONDS_PER_VARIANT"]

HOPS = """
[[hop]]
name = "front"

[[hop]]
name = "worker"
concurrency = 1
work = { kind = "sleep", dist = "fixed", value = "5ms" }
"""
TAIL = """
[check]
max_error_rate = 1.0

[telemetry]
sampling = 0.0
"""

def vmhwm_kb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None

def run(name, text):
    """Runs a scenario, sampling every process's VmHWM; returns the
    summary's variants and {variant: {process: peak kB}}."""
    path = OUT / f"{name}.toml"
    path.write_text(text)
    results = OUT / name
    proc = subprocess.Popen([BIN, "run", str(path), "--results", str(results), "--quiet"],
                            stdout=subprocess.DEVNULL)
    peaks = {}
    while proc.poll() is None:
        for pid_file in results.glob("*/*/logs/*/*.pid"):
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            kb = vmhwm_kb(pid)
            if kb is not None:
                v = peaks.setdefault(pid_file.parent.name, {})
                v[pid_file.stem] = max(v.get(pid_file.stem, 0), kb)
        kb = vmhwm_kb(proc.pid)
        if kb is not None:
            peaks.setdefault("orchestrator", {})["tailmesh run"] = kb
        time.sleep(0.1)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: tailmesh run exited {proc.returncode}")
    runs = sorted(p for p in results.glob("*/*") if p.name != "latest")
    return json.load(open(runs[-1] / "summary.json"))["variants"], peaks

# 1. Capacity, closed loop.
variants, _ = run("capacity", f"""
name = "capacity"
seed = 17
[load]
mode = "closed"
concurrency = 8
duration = "{SECS}s"
warmup = "500ms"
timeout = "2s"
{HOPS}
[[variant]]
name = "push"
[[variant]]
name = "pull"
set = {{ "hop.worker.transport" = "pull" }}
{TAIL}""")
capacity = {v["name"]: v["ok_rate"] for v in variants}
for t, c in capacity.items():
    print(f"capacity {t}: {c:.1f} ok/s")

# 2. Twice the capacity, each discipline.
blocks = []
for t in ("push", "pull"):
    for d in ("fifo", "lifo", "adaptive"):
        blocks.append(f"""
[[variant]]
name = "{t}-{d}"
set = {{ "hop.worker.transport" = "{t}", "hop.worker.discipline" = "{d}", "load.rate" = {2 * capacity[t]:.0f} }}
""")
variants, peaks = run("overload", f"""
name = "overload-bench"
seed = 17
[load]
mode = "open"
rate = 1
duration = "{SECS}s"
warmup = "1s"
timeout = "500ms"
{HOPS}
{''.join(blocks)}
{TAIL}""")

mb = lambda kb: f"{kb / 1024:.0f}" if kb else "-"
print()
print("| variant | offered/s | goodput/s | goodput / capacity | p50 | p99 (answered) | failed | broker RSS MB | front RSS MB | worker RSS MB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for v in variants:
    t = v["name"].split("-")[0]
    failed = 1 - v["ok"] / v["sent"] if v["sent"] else 0
    p = peaks.get(v["name"], {})
    print(f"| {v['name']} | {v['load']['rate']:.0f} | {v['ok_rate']:.1f} | {v['ok_rate'] / capacity[t]:.2f} | "
          f"{v['latency']['p50_us'] / 1000:.1f} ms | {v['latency']['p99_us'] / 1000:.1f} ms | {failed * 100:.1f} % | "
          f"{mb(p.get('broker'))} | {mb(p.get('hop-front-0'))} | {mb(p.get('hop-worker-0'))} |")
print(f"\norchestrator peak RSS: {mb(peaks.get('orchestrator', {}).get('tailmesh run'))} MB")
PY
