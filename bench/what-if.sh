#!/usr/bin/env bash
# What-if predictions against real runs, on an imported mesh:
# bench/what-if.toml (five services, stages, a call made by half the
# requests, one service slow 5 % of the time) is run with every trace
# kept and its traces imported as a scenario (`tailmesh import -o`). Each
# round then runs the imported scenario (the baseline), predicts each
# change from that run (`tailmesh predict --from RUN --what-if ...`) and
# runs the changed scenario, for six changes:
#   work+2ms    db's own time 2 ms longer (every quantile of its work)
#   pull        cart reached through the broker
#   loss        1 % packet loss on db's link (netns launcher: root)
#   hedge       front hedges price after 6 ms
#   replica     db with two replicas
#   parallel    front calls auth beside cart and price, not before them
# Per change: measured and predicted p50, p90 and p99 and their ratio,
# per round; "as run" is the baseline recomposed unchanged (the method's
# own error). Goal: within 5 % for the changes that move no queue.
#
# Usage: bench/what-if.sh [-r R] [--json FILE]
#   -r R          rounds (default 3)
#   --json FILE   also write the numbers as JSON
#
# The binary: TAILMESH_BIN, or the release build of this checkout (built
# now). Loopback and namespaces it creates only; the temp dir is removed
# on every exit path.
set -euo pipefail

ROUNDS=3
JSON_OUT=""
usage() { sed -n '2,/^set /{ /^#/p; }' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "what-if: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
if ! [[ $ROUNDS =~ ^[1-9][0-9]*$ ]]; then
    echo "what-if: -r wants a positive integer, got '$ROUNDS'" >&2
    exit 2
fi
if [[ -n $JSON_OUT ]]; then
    JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
BENCH=what-if
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
steps_traps
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
if [[ $(id -u) != 0 ]]; then
    say "the loss change needs the netns launcher: run as root"
    exit 1
fi
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-what-if.XXXXXX")"
release_binary
busy_gate 0

say "the source run, every trace kept"
step INT "$BIN" run "$HERE/what-if.toml" --results "$TMP/source" --quiet >"$TMP/source.out" 2>&1 \
    || { cat "$TMP/source.out" >&2; exit 1; }
step TERM "$BIN" import jaeger "$TMP/source/shop/latest/traces.jaeger.json" -o "$TMP/imported.toml" \
    >"$TMP/import.out" 2>&1 || { cat "$TMP/import.out" >&2; exit 1; }

# The changes, as --what-if arguments, from the imported file.
python3 - "$TMP/imported.toml" "$TMP/changes" <<'PY'
import re, sys
text, out = open(sys.argv[1]).read(), sys.argv[2]
hops = {m.group(1): m.start() for m in re.finditer(r'^name = "([^"]+)"', text, re.M)}
def block(name):
    start = hops[name]
    end = min([p for p in hops.values() if p > start] + [len(text)])
    return text[start:end]
def us(t):
    n, unit = re.fullmatch(r"([0-9.]+)(ns|us|ms|s)", t).groups()
    return float(n) * {"ns": 1e-3, "us": 1, "ms": 1e3, "s": 1e6}[unit]
work = re.search(r"^work = (.*)$", block("db"), re.M).group(1)
slower = re.sub(r'"([0-9.]+(?:ns|us|ms|s))"', lambda m: f'"{us(m.group(1)) + 2000:.0f}us"', work)
down = re.search(r"^downstream = (.*)$", block("front"), re.M).group(1)
assert down.startswith("[[") and down.endswith("]]"), down
flat = "[[" + down[2:-2].replace("], [", ", ") + "]]"
changes = {
    "work+2ms": f"hop.db.work={slower}",
    "pull": 'hop.cart.transport="pull"',
    "loss": 'hop.db.net={loss=0.01}',
    "hedge": 'hop.price.client={hedge_after="6ms"}',
    "replica": 'hop.db.replicas=2',
    "parallel": f"hop.front.downstream={flat}",
}
with open(out, "w") as f:
    for name, arg in changes.items():
        f.write(f"{name}\t{arg}\n")
PY

for ((round = 1; round <= ROUNDS; round++)); do
    dir="$TMP/round-$round"
    mkdir -p "$dir"
    say "round $round of $ROUNDS: the baseline"
    step INT "$BIN" run "$TMP/imported.toml" --results "$dir/base" --quiet >"$dir/base.out" 2>&1 \
        || { cat "$dir/base.out" >&2; exit 1; }
    base="$(find "$dir/base" -mindepth 2 -maxdepth 2 -type d ! -name latest | head -1)"
    step TERM "$BIN" predict "$TMP/imported.toml" --from "$base" --json >"$dir/as-run.json" \
        || exit 1
    while IFS=$'\t' read -r name arg; do
        say "round $round of $ROUNDS: $name"
        step TERM "$BIN" predict "$TMP/imported.toml" --from "$base" --what-if "$arg" --json \
            >"$dir/$name.json" || exit 1
        # The changed scenario: the import with the change as its variant.
        python3 - "$TMP/imported.toml" "$arg" "$dir/$name.toml" <<'PY'
import json, sys
src, arg, out = sys.argv[1:]
key, value = arg.split("=", 1)
with open(out, "w") as f:
    f.write(open(src).read())
    f.write(f'\n[[variant]]\nname = "changed"\nset = {{ {json.dumps(key)} = {value} }}\n')
PY
        step INT "$BIN" run "$dir/$name.toml" --results "$dir/$name" --quiet >"$dir/$name.out" 2>&1 \
            || { cat "$dir/$name.out" >&2; exit 1; }
    done <"$TMP/changes"
    echo "$(cut -d' ' -f1 /proc/loadavg)" >"$dir/load"
done
echo
echo "what-if: bench/what-if.toml imported, $ROUNDS round(s), $(nproc) cores, $(date -u +%Y-%m-%d)"
python3 - "$TMP" "$ROUNDS" "${JSON_OUT:-}" <<'PY'
import glob, json, os, sys

tmp, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = [l.split("\t")[0] for l in open(os.path.join(tmp, "changes"))]
QS = ("p50", "p90", "p99")

def measured(results):
    d = next(d for d in glob.glob(os.path.join(results, "*", "*")) if not d.endswith("latest"))
    with open(os.path.join(d, "summary.json")) as f:
        v = json.load(f)["variants"][0]
    assert v["accounted"], f"{d}: a request is not accounted for"
    return {q: v["latency"][f"{q}_us"] for q in QS}

rows = {}
for r in range(1, rounds + 1):
    base = os.path.join(tmp, f"round-{r}")
    as_run = json.load(open(os.path.join(base, "as-run.json")))
    rows.setdefault("as run", []).append({
        "measured": {q: as_run["measured"][f"{q}_us"] for q in QS},
        "predicted": {q: as_run["as_run"][f"{q}_us"] for q in QS},
    })
    for n in names:
        p = json.load(open(os.path.join(base, f"{n}.json")))
        rows.setdefault(n, []).append({
            "measured": measured(os.path.join(base, n)),
            "predicted": {q: p["changed"][f"{q}_us"] for q in QS},
        })
print("| change | " + " | ".join(f"{q} measured | {q} predicted / measured" for q in QS) + " |")
print("|---|" + "---|---|" * len(QS))
worst = {}
for n, rs in rows.items():
    cells = []
    for q in QS:
        m = " / ".join(f"{x['measured'][q] / 1000:.2f}" for x in rs)
        ratios = [x["predicted"][q] / x["measured"][q] for x in rs if x["predicted"][q]]
        cells.append(f"{m} ms")
        cells.append(" / ".join(f"{x:.3f}" for x in ratios) or "-")
        worst[(n, q)] = max((abs(x - 1) for x in ratios), default=float("inf"))
    print(f"| {n} | " + " | ".join(cells) + " |")
print()
loads = [float(open(os.path.join(tmp, f"round-{r}", "load")).read()) for r in range(1, rounds + 1)]
print("one value per round; load average (1 min) after each round: " + " / ".join(f"{l:.2f}" for l in loads))
for n in rows:
    w = max(worst[(n, q)] for q in QS)
    print(f"{n}: worst {w:.1%} off ({'within' if w <= 0.05 else 'outside'} 5 %)")
if out:
    with open(out, "w") as f:
        json.dump(rows, f, indent=2)
PY
[[ -n $JSON_OUT ]] && say "wrote $JSON_OUT"
exit 0
