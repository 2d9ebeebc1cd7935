#!/usr/bin/env bash
# What the mesh-client features cost: TLS per link (bench/tls-chain.toml:
# plaintext, TLS, mTLS, and per-request connections with and without
# session resumption over four zero-work hops, one request in flight) and
# the balancing policies per request (bench/balance-cost.toml:
# round_robin, p2c, peak-EWMA, ejection). Each scenario runs ROUNDS times;
# a run holds all its variants one after the other, so each round compares
# them side by side. Prints, per variant, the median over rounds of the
# achieved rate, p50 and p99, and the p50 against plaintext over the same
# kind of connection (per link, or per handshake) or the first policy.
#
#   bench/mesh-clients.sh [rounds]     (default 3)
#
# Uses a release build (or the binary TAILMESH_BIN names); results go to a
# temporary folder, removed on exit. The numbers hold only on a quiet
# machine: the load average is printed before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
if [[ -z "${TAILMESH_BIN:-}" ]]; then
  cargo build --release --quiet -p tailmesh
fi
bin="${TAILMESH_BIN:-target/release/tailmesh}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
for scenario in bench/tls-chain.toml bench/balance-cost.toml; do
  name="$(basename "$scenario" .toml)"
  for i in $(seq "$rounds"); do
    "$bin" run "$scenario" --results "$out/$name-$i" --quiet --no-traces >/dev/null
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" "$rounds" <<'PY'
import json, pathlib, statistics, sys

out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
LINKS = {"tls-chain": 4}


def summaries(name):
    for i in range(1, rounds + 1):
        runs = sorted(p for p in (out / f"{name}-{i}").glob("*/*") if p.name != "latest")
        if not runs:
            sys.exit(f"{name} round {i}: no results")
        yield json.load(open(runs[-1] / "summary.json"))


for name in ("tls-chain", "balance-cost"):
    per_variant = {}
    for s in summaries(name):
        for v in s["variants"]:
            if not v.get("accounted") or v["ok"] != v["sent"]:
                sys.exit(f"{name} / {v['name']}: {v['sent'] - v['ok']} of {v['sent']} request(s) not ok")
            lat = v["latency"]
            per_variant.setdefault(v["name"], []).append((v["ok_rate"], lat["p50_us"], lat["p99_us"]))
    links = LINKS.get(name)
    print(f"\n{name} ({rounds} rounds, medians)\n")
    if links:
        # Against plaintext over the same kind of connection: per link over
        # long-lived connections (a TLS record each way per hop), per
        # request with a connection per request (one handshake, on the
        # load generator's link).
        head = "| variant | req/s | p50 | p99 | p50 vs plaintext | cost |"
    else:
        head = "| variant | req/s | p50 | p99 | p50 vs first |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    medians = {
        variant: tuple(statistics.median(r[i] for r in rows) for i in range(3))
        for variant, rows in per_variant.items()
    }
    first = next(iter(medians.values()))[1]
    for variant, (rate, p50, p99) in medians.items():
        line = f"| {variant} | {rate:,.0f} | {p50:,.0f} µs | {p99:,.0f} µs |"
        if links:
            per_request = "per-request" in variant
            base = medians.get("plaintext-per-request" if per_request else "plaintext")
            if base is None:
                line += " - | - |"
            elif per_request:
                line += f" {p50 - base[1]:+,.0f} µs | {p50 - base[1]:+,.0f} µs per handshake |"
            else:
                line += f" {p50 - base[1]:+,.0f} µs | {(p50 - base[1]) / links:+,.1f} µs per link |"
        else:
            line += f" {p50 - first:+,.0f} µs |"
        print(line)
PY
