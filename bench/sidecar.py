#!/usr/bin/env python3
"""Arithmetic for bench/sidecar.sh (standard library only).

Subcommands:
  scenario SRC N DST [--no-direct] [--no-layers]
                         copy the scenario SRC to DST with `requests = N`
                         in [load] and its relative paths (a `command`
                         program written with a `/`, `proto` files) made
                         absolute, so the copy runs from anywhere; with
                         --no-direct, without the `direct` variant, with
                         --no-layers without the two tonic variants (a
                         build without `layers`) (also used by
                         bench/tracing.sh's -n)
  round SUMMARY N OUT TSV
                         read one run's summary.json, check that every
                         variant answered all N requests, and write the
                         round's numbers to OUT (JSON) and its ratio to
                         TSV (NAME<TAB>VALUE, for the intervals binary)
  report DIR [JSON]      print the table from DIR/round-*.json (medians
                         over the rounds), optionally write it to JSON
                         (with DIR/intervals.json)
"""

import glob
import json
import os
import re
import statistics
import sys

GOAL = 1.2
# The ratios' names in the intervals table (bench/sidecar.sh sets the goal
# on RATIO).
RATIO = "sidecar / forwarding hop"
OVER_ZERO = "(sidecar chain - zero chain p50) / forwarding hop"
# The layers' cost per call over the sidecar's (bench/sidecar.sh: <= 0.5).
LAYERS = "tailmesh layers / sidecar"


def fail(msg):
    print(f"sidecar: {msg}", file=sys.stderr)
    sys.exit(1)


def scenario(src, n, dst, leave_out=()):
    base = os.path.dirname(os.path.abspath(src))
    out, section, done = [], None, False

    def absolute(m):
        path = m.group(1)
        if path.startswith("/") or "/" not in path:
            return m.group(0)
        return '"' + os.path.normpath(os.path.join(base, path)) + '"'

    for line in open(src):
        m = re.match(r"\s*\[\[?([^\]]+)\]\]?", line)
        if m:
            section = m.group(1).strip()
        if section == "load" and re.match(r"\s*requests\s*=", line):
            line, done = f"requests = {n}\n", True
        if re.search(r"\b(command|proto)\s*=", line):
            line = re.sub(r'"(\.\.?/[^"]*)"', absolute, line)
        out.append(line)
    if not done:
        fail(f"{src}: no [load] requests to replace")
    # Each [[variant]] block runs to the next one (the variants come last).
    blocks = re.split(r"(?m)^(?=\[\[variant\]\])", "".join(out))
    for name in leave_out:
        named = [b for b in blocks if re.match(rf'\[\[variant\]\]\s*name\s*=\s*"{name}"', b)]
        if not named:
            fail(f"{src}: no variant \"{name}\" to leave out")
        blocks = [b for b in blocks if b not in named]
    with open(dst, "w") as f:
        f.write("".join(blocks))


def p50(stats):
    return stats["p50_us"]


def round_numbers(summary_path, n, out, tsv):
    s = json.load(open(summary_path))
    variants = {v["name"]: v for v in s["variants"]}
    for name in ("zero", "sidecar", "direct", "tonic-plain", "tonic-layers"):
        v = variants.get(name)
        if v is None and name not in ("zero", "sidecar"):
            continue
        if v is None:
            fail(f"{summary_path}: no variant {name!r}")
        if v["ok"] != n:
            fail(
                f"{summary_path}: variant {name}: {v['ok']} of {n} requests ok "
                f"(errors {v['errors']}, timeouts {v['timeouts']})"
            )
    zero = variants["zero"]
    hops = zero["hops"]
    if len(hops) < 2:
        fail(f"{summary_path}: the zero-work chain has {len(hops)} hop(s), at least 2 wanted")
    # The entry's total holds every hop after it; the leaf's holds only
    # itself: the difference is what the forwarding hops added.
    forwarding = (p50(hops[0]["total"]) - p50(hops[-1]["total"])) / (len(hops) - 1)
    direct = variants.get("direct")
    direct_p50 = p50(direct["latency"]) if direct else None
    sidecar = p50(variants["sidecar"]["latency"]) - direct_p50 if direct else None
    plain, layered = variants.get("tonic-plain"), variants.get("tonic-layers")
    plain_p50 = p50(plain["latency"]) if plain else None
    layered_p50 = p50(layered["latency"]) if layered else None
    layers = layered_p50 - plain_p50 if plain and layered else None
    loads = [v["instrument"]["load_average"][0] for v in s["variants"] if v.get("instrument")]
    numbers = {
        "requests": n,
        "zero_p50_us": p50(zero["latency"]),
        "zero_entry_total_p50_us": p50(hops[0]["total"]),
        "zero_leaf_total_p50_us": p50(hops[-1]["total"]),
        "forwarding_hop_us": forwarding,
        "sidecar_p50_us": p50(variants["sidecar"]["latency"]),
        "direct_p50_us": direct_p50,
        "sidecar_p99_us": variants["sidecar"]["latency"]["p99_us"],
        "direct_p99_us": direct["latency"]["p99_us"] if direct else None,
        # What the service hop adds over a zero-work leaf in its place:
        # comparable between builds without the direct variant.
        "over_zero_leaf_us": p50(variants["sidecar"]["latency"]) - p50(zero["latency"]),
        "sidecar_cost_us": sidecar,
        "ratio": sidecar / forwarding if sidecar is not None and forwarding > 0 else None,
        "tonic_plain_p50_us": plain_p50,
        "tonic_layers_p50_us": layered_p50,
        "layers_cost_us": layers,
        "layers_ratio": layers / sidecar if layers is not None and sidecar else None,
        "load_average": loads,
        "busy": any(v.get("instrument", {}).get("busy") for v in s["variants"]),
    }
    with open(out, "w") as f:
        json.dump(numbers, f, indent=2)
    # Every round gives its ratio, even a forwarding cost at or below zero
    # on a noisy round (left out, the worst rounds would narrow the
    # interval); a zero cost is no number, and the interval then says n/a.
    over = lambda cost: cost / forwarding if forwarding else float("inf")
    with open(tsv, "w") as f:
        if sidecar is not None:
            f.write(f"{RATIO}\t{over(sidecar)!r}\n")
        else:
            # No direct variant (an older build): what the service hop adds
            # over a zero-work leaf, against the same forwarding hop.
            f.write(f"{OVER_ZERO}\t{over(numbers['over_zero_leaf_us'])!r}\n")
        if layers is not None and sidecar is not None:
            # A sidecar cost at or below zero (a noisy round) is no number.
            value = layers / sidecar if sidecar > 0 else float("inf")
            f.write(f"{LAYERS}\t{value!r}\n")


def report(d, json_out=None):
    rounds = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(d, "round-*.json")))]
    if not rounds:
        fail(f"{d}: no rounds")

    def med(key):
        values = [r[key] for r in rounds if r[key] is not None]
        return statistics.median(values) if values else None

    rows = [
        ("zero-work chain a -> b -> svc, p50", "zero_p50_us"),
        ("  entry hop's total p50", "zero_entry_total_p50_us"),
        ("  leaf hop's total p50", "zero_leaf_total_p50_us"),
        ("forwarding hop, per hop", "forwarding_hop_us"),
        ("a -> b -> sidecar -> service, p50", "sidecar_p50_us"),
        ("a -> b -> service (direct), p50", "direct_p50_us"),
        ("sidecar, per call", "sidecar_cost_us"),
        ("sidecar chain p50 - zero chain p50", "over_zero_leaf_us"),
        ("a -> b -> tonic echo (direct, plain), p50", "tonic_plain_p50_us"),
        ("a -> b -> tonic echo in the layers, p50", "tonic_layers_p50_us"),
        ("layers, per call", "layers_cost_us"),
    ]
    width = max(len(label) for label, _ in rows)
    for label, key in rows:
        value = med(key)
        if value is None:
            print(f"{label:<{width}}       n/a")
            continue
        by_round = " / ".join(f"{r[key]:.1f}" for r in rounds) if len(rounds) > 1 else ""
        print(f"{label:<{width}}  {value:8.1f} us  {by_round}")
    ratio = med("ratio")
    if any(r["busy"] for r in rounds):
        print("tailmesh run called the machine busy in some round (its instrument report)")
    if json_out:
        path = os.path.join(d, "intervals.json")
        intervals = json.load(open(path)) if os.path.exists(path) else None
        with open(json_out, "w") as f:
            json.dump(
                {"rounds": rounds, "ratio_median": ratio, "goal": GOAL, "intervals": intervals},
                f,
                indent=2,
            )


def main(argv):
    if len(argv) >= 2 and argv[1] == "scenario" and len(argv) >= 5:
        leave_out = []
        for flag in argv[5:]:
            if flag == "--no-direct":
                leave_out.append("direct")
            elif flag == "--no-layers":
                leave_out += ["tonic-plain", "tonic-layers"]
            else:
                fail(f"scenario: unknown flag {flag}")
        scenario(argv[2], int(argv[3]), argv[4], leave_out)
    elif len(argv) >= 2 and argv[1] == "round" and len(argv) == 6:
        round_numbers(argv[2], int(argv[3]), argv[4], argv[5])
    elif len(argv) >= 2 and argv[1] == "report" and len(argv) in (3, 4):
        report(argv[2], argv[3] if len(argv) == 4 else None)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv)
