#!/usr/bin/env bash
# Root-cause cases on two meshes, scored: `tailmesh cases` on the default
# 3-hop chain and on scenarios/rca-mesh.toml (12 services), COUNT
# injections each, every fault kind in turn (the netns launcher: root),
# then `tailmesh cases score` on each, and the table of docs/findings/rca-cases.md:
# per mesh, method and fault kind, the kept cases, AC@1, AC@3 and Avg@5;
# the injections dropped as invisible; and what tailmesh's misses have in
# common (their kind, target and the service it put first). The load
# average before and after each mesh is printed: keep it under 1.5.
#
# Usage: bench/cases.sh [-n COUNT] [-l LENGTH] [-s SEED] [-o DIR]
#   -n COUNT   injections per mesh (default 150: about 100 kept cases)
#   -l LENGTH  each case's load (default 10s)
#   -s SEED    the seed the faults are drawn from (default 1)
#   -o DIR     where the cases stay (default results/cases-bench/<UTC time>);
#              a DIR made before with the same -l and -s goes on with its
#              sets up to COUNT injections each
#
# Uses a release build, or the binary TAILMESH_BIN names. Needs root (the
# netns launcher). Loopback and the run's own namespaces only. Each run is
# stopped by its PID on Ctrl-C (it stops its own hops and namespaces).
set -euo pipefail

BENCH=cases
COUNT=150
LENGTH=10s
SEED=1
OUT=""
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n|--count) COUNT="${2:?-n needs a number}"; shift 2 ;;
        -l|--length) LENGTH="${2:?-l needs a duration}"; shift 2 ;;
        -s|--seed) SEED="${2:?-s needs a number}"; shift 2 ;;
        -o|--out) OUT="${2:?-o needs a folder}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
[[ $COUNT =~ ^[1-9][0-9]*$ && $SEED =~ ^[0-9]+$ ]] || { echo "$BENCH: -n and -s want integers" >&2; exit 2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
((EUID == 0)) || { say "needs root: loss and delay cases run on the netns launcher"; exit 2; }
steps_traps
cd "$REPO"
OUT="${OUT:-results/cases-bench/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
release_binary
busy_gate 0

for mesh in default rca-mesh; do
    say "$mesh: $COUNT cases of $LENGTH"
    step INT "$BIN" cases "scenarios/$mesh.toml" --count "$COUNT" --length "$LENGTH" --seed "$SEED" \
        --netns -o "$OUT/$mesh" >"$OUT/$mesh.out" 2>"$OUT/$mesh.err" \
        || { say "tailmesh cases failed:"; tail -20 "$OUT/$mesh.err" >&2; exit 1; }
    echo "load average after $mesh: $(cut -d' ' -f1-3 /proc/loadavg)"
    step INT "$BIN" cases score "$OUT/$mesh" >"$OUT/$mesh.score" 2>&1 \
        || { say "tailmesh cases score failed:"; cat "$OUT/$mesh.score" >&2; exit 1; }
done

python3 - "$OUT" <<'PY'
import collections, json, pathlib, sys

out = pathlib.Path(sys.argv[1])
print("| mesh | method | kind | cases | AC@1 | AC@3 | Avg@5 |")
print("|---|---|---|---|---|---|---|")
for mesh in ("default", "rca-mesh"):
    scores = json.loads((out / mesh / "scores.json").read_text())
    for m in scores["methods"]:
        for k in m["kinds"]:
            print(f"| {mesh} | {m['method']} | {k['kind']} | {k['cases']} | "
                  f"{k['ac1']:.2f} | {k['ac3']:.2f} | {k['avg5']:.2f} |")
print()
for mesh in ("default", "rca-mesh"):
    index = json.loads((out / mesh / "index.json").read_text())
    by_kind = collections.Counter()
    dropped = collections.Counter()
    for c in index["cases"]:
        by_kind[c["fault"]["kind"]] += 1
        if not c["verdict"]["kept"]:
            why = "invisible" if c["verdict"]["reason"].startswith("invisible") else "broken before"
            dropped[(c["fault"]["kind"], why)] += 1
    print(f"{mesh}: {len(index['cases'])} injections, {index['kept']} kept; dropped by kind: "
          + ", ".join(f"{k} {why} {n}/{by_kind[k]}" for (k, why), n in sorted(dropped.items())))
    misses = []
    for c in index["cases"]:
        if not c["verdict"]["kept"]:
            continue
        ranking = json.loads((out / mesh / c["case"] / "rankings" / "tailmesh.json").read_text())["ranking"]
        first = ranking[0]["service"] if ranking else "-"
        if first != c["fault"]["service"]:
            f = c["fault"]
            misses.append(f"{c['case']} {f['kind']} {f['service']}"
                          + (f"/{f['replica']}" if f.get("replica") is not None else "")
                          + f" -> {first}")
    print(f"{mesh}: tailmesh's misses at 1: " + ("; ".join(misses) or "none"))
PY
echo "cases in $OUT"
