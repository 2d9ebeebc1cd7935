#!/usr/bin/env python3
"""Arithmetic for bench/floor.sh (standard library only).

Subcommands:
  body OUT                      write the h2load body: one length-prefixed
                                gRPC message holding a CallRequest
                                (request_id = 1, 64-byte payload)
  check-reply FILE HOP          decode one raw gRPC reply body (as printed by
                                `nghttp`) and check it is a real CallReply:
                                request_id 1, the payload echoed, a path
                                record naming HOP
  h2load STDOUT LOG N HOP OUT   parse h2load's summary and --log-file, check
                                that every request got a real gRPC reply, and
                                write p50/p99/req/s to OUT (JSON)
  tailmesh SUMMARY N OUT        read a tailmesh summary.json, check it, and
                                write p50/p99/req/s to OUT (JSON)
  load RAW N OUT                read `tailmesh load`'s JSON, check it, and
                                write p50/p99/req/s to OUT (JSON)
  lean RAW N OUT                the same for the lean client's (h2lean) JSON
  floor-round DIR R OUT         write round R's ratios (NAME<TAB>VALUE
                                lines, for the intervals binary) from
                                DIR/h2load-R.json and DIR/t{1,3}-{off,on}-R.json
  report DIR R [JSON]           print the floor table, medians of R rounds
                                of DIR/h2load-*.json and DIR/t{1,3}-{off,on}-*.json
                                (tailmesh with traces off and on),
                                optionally write everything to JSON (with
                                DIR/intervals.json when present)
  generator-round DIR R OUT     write round R's rate ratios to h2load
                                (NAME<TAB>VALUE lines) from
                                DIR/{h2load,tailmesh,h2lean}-{1,64,128}-R.json
  generator-report DIR R [JSON] print the generator table from
                                DIR/{h2load,tailmesh}-{1,64,128}-{1..R}.json,
                                and DIR/h2lean-* beside them when present
"""

import json
import math
import os
import re
import sys

PAYLOAD = bytes(i % 251 for i in range(64))
REQUEST_ID = 1


def fail(msg):
    print(f"floor: {msg}", file=sys.stderr)
    sys.exit(1)


# --- protobuf, just enough -------------------------------------------------


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf, i):
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(buf):
    """Yields (field number, wire type, value) for varint and length-delimited fields."""
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated length-delimited field")
            v, i = buf[i : i + n], i + n
        else:
            raise ValueError(f"unexpected wire type {wt}")
        yield num, wt, v


def call_request():
    # CallRequest: request_id = 1 (field 1, varint), payload (field 2, bytes).
    return b"\x08" + varint(REQUEST_ID) + b"\x12" + varint(len(PAYLOAD)) + PAYLOAD


def grpc_frame(message):
    return b"\x00" + len(message).to_bytes(4, "big") + message


def min_reply_frame(hop):
    """A lower bound on the size of a framed CallReply to our request from
    a zero-work hop named `hop`: request_id, the 64-byte payload, and one
    HopRecord with at least its hop name, transport "push" and a nonzero
    total_ns (tag + at least one varint byte; service_ns may be 0 and so
    absent). A wrong path or any gRPC error answers with no DATA at all."""
    record = 2 + len(hop) + 2 + 2 + len("push")
    reply = 2 + 2 + len(PAYLOAD) + 2 + record
    return 5 + reply


# --- subcommands -----------------------------------------------------------


def cmd_body(out):
    with open(out, "wb") as f:
        f.write(grpc_frame(call_request()))


def cmd_check_reply(path, hop):
    data = open(path, "rb").read()
    if len(data) < 5:
        fail(f"reply body is {len(data)} bytes: not a gRPC message (wrong path or an error status?)")
    if data[0] != 0:
        fail("reply is compressed or malformed (flag byte != 0)")
    n = int.from_bytes(data[1:5], "big")
    if len(data) != 5 + n:
        fail(f"reply frame says {n} bytes but the body holds {len(data) - 5}")
    request_id = payload = None
    path_hops = []
    try:
        for num, wt, v in fields(data[5:]):
            if num == 1 and wt == 0:
                request_id = v
            elif num == 2 and wt == 2:
                payload = v
            elif num == 3 and wt == 2:
                for rnum, rwt, rv in fields(v):
                    if rnum == 1 and rwt == 2:
                        path_hops.append(rv.decode())
    except ValueError as e:
        fail(f"reply is not a CallReply: {e}")
    if request_id != REQUEST_ID:
        fail(f"reply request_id = {request_id}, sent {REQUEST_ID}")
    if payload != PAYLOAD:
        fail("reply payload differs from the one sent")
    if path_hops != [hop]:
        fail(f"reply path = {path_hops}, expected [{hop!r}]")
    print(len(data))


def percentile(sorted_values, p):
    """Nearest rank (the smallest value with at least p % of samples at or
    below it), as HdrHistogram's value_at_percentile."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def cmd_h2load(stdout_path, log_path, n, hop, out):
    n = int(n)
    text = open(stdout_path).read()
    m = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout",
        text,
    )
    if not m:
        fail(f"cannot parse h2load output:\n{text}")
    total, _, done, succeeded, failed, errored, timeouts = map(int, m.groups())
    if (done, succeeded) != (n, n) or failed or errored or timeouts:
        fail(f"h2load: {succeeded}/{n} succeeded, {failed} failed, {errored} errored, {timeouts} timeout")
    m = re.search(r"status codes: (\d+) 2xx", text)
    if not m or int(m.group(1)) != n:
        fail("h2load: not every response was HTTP 2xx")
    m = re.search(r"\((\d+)\) data", text)
    if not m:
        fail("cannot parse h2load's traffic line")
    data_bytes = int(m.group(1))
    per_req = data_bytes / n
    # HTTP 200 proves nothing: a wrong path (or any gRPC error) answers 200
    # with a trailers-only response, i.e. no DATA at all.
    need = min_reply_frame(hop)
    if per_req < need:
        fail(
            f"h2load received {per_req:.1f} data bytes per request, a real reply carrying the "
            f"64-byte payload has at least {need}: the responses were not gRPC replies"
        )
    m = re.search(r"finished in [^,]+, ([\d.]+) req/s", text)
    rps = float(m.group(1)) if m else 0.0

    durations = []
    for line in open(log_path):
        cols = line.split()
        if len(cols) >= 3:
            if cols[1] != "200":
                fail(f"h2load log: status {cols[1]}")
            durations.append(int(cols[2]))
    if len(durations) != n:
        fail(f"h2load log holds {len(durations)} requests, expected {n}")
    durations.sort()
    result = {
        "what": "h2load -> 1 hop",
        "count": n,
        "p50_us": percentile(durations, 50),
        "p99_us": percentile(durations, 99),
        "mean_us": sum(durations) / n,
        "max_us": durations[-1],
        "rps": rps,
        "data_bytes_per_request": per_req,
        "min_reply_bytes": need,
    }
    json.dump(result, open(out, "w"), indent=2)


def cmd_tailmesh(summary_path, n, out):
    n = int(n)
    summary = json.load(open(summary_path))
    v = summary["variants"][0]
    hops = len(v.get("hops", []))
    if v["ok"] != n or not v["accounted"] or v["timeouts"] or v["errors"]:
        fail(
            f"{summary_path}: {v['ok']}/{n} ok, {v['timeouts']} timeouts, errors {v['errors']}, "
            f"accounted {v['accounted']}"
        )
    lat = v["latency"]
    result = {
        "what": f"tailmesh -> {hops} hop{'s' if hops != 1 else ''}",
        "hops": hops,
        "count": lat["count"],
        "p50_us": lat["p50_us"],
        "p99_us": lat["p99_us"],
        "mean_us": lat["mean_us"],
        "max_us": lat["max_us"],
        "rps": v["achieved_rate"],
    }
    json.dump(result, open(out, "w"), indent=2)


def cmd_load(raw_path, n, out):
    n = int(n)
    lines = [l for l in open(raw_path) if l.strip().startswith("{")]
    if not lines:
        fail(f"{raw_path}: no JSON line from tailmesh load")
    r = json.loads(lines[-1])
    if r["ok"] != n or r["failed"]:
        fail(f"tailmesh load: {r['ok']}/{n} ok, {r['failed']} failed")
    result = {
        "what": "tailmesh load -> 1 hop",
        "count": r["ok"],
        "p50_us": r["p50_us"],
        "p99_us": r["p99_us"],
        "rps": r["ok_per_s"],
        "links": r["links"],
    }
    json.dump(result, open(out, "w"), indent=2)


def cmd_lean(raw_path, n, out):
    n = int(n)
    lines = [l for l in open(raw_path) if l.strip().startswith("{")]
    if not lines:
        fail(f"{raw_path}: no JSON line from h2lean")
    r = json.loads(lines[-1])
    if r["sent"] != n or r["ok"] != n or r["failed"] or r["connection_errors"]:
        fail(f"h2lean: {r['ok']}/{n} ok, {r['failed']} failed, {r['connection_errors']}")
    result = {
        "what": "h2lean -> 1 hop",
        "count": r["ok"],
        "p50_us": r["p50_us"],
        "p99_us": r["p99_us"],
        "rps": r["ok_per_s"],
    }
    json.dump(result, open(out, "w"), indent=2)


def median(values):
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def generator_tools(d):
    tools = ["h2load", "tailmesh"]
    if os.path.exists(f"{d}/h2lean-1-1.json"):
        tools.append("h2lean")
    return tools


GENERATOR_LEVELS = [1, 64, 128]


def generator_ratio_name(tool, n):
    return f"{'tailmesh load' if tool == 'tailmesh' else tool} / h2load rate, {n} in flight"


def cmd_generator_round(d, r, out):
    ratios = {}
    for tool in generator_tools(d)[1:]:
        for n in GENERATOR_LEVELS:
            h = json.load(open(f"{d}/h2load-{n}-{r}.json"))
            x = json.load(open(f"{d}/{tool}-{n}-{r}.json"))
            ratios[generator_ratio_name(tool, n)] = x["rps"] / h["rps"]
    write_values(out, ratios)


def cmd_generator_report(d, rounds, json_out=None):
    rounds = int(rounds)
    levels = GENERATOR_LEVELS
    tools = generator_tools(d)
    others = tools[1:]
    doc = {"rounds": rounds, "tools": tools, "levels": {}}
    head = f"{'in flight':>9}  {'h2load req/s':>12}"
    for t in others:
        head += f"  {t + ' req/s':>14}  {'ratio':>5}"
    for t in tools:
        head += f"  {t + ' p50':>12}"
    for t in tools:
        head += f"  {t + ' p99':>12}"
    print(head)
    for n in levels:
        runs = {
            tool: [json.load(open(f"{d}/{tool}-{n}-{r}.json")) for r in range(1, rounds + 1)]
            for tool in tools
        }
        per_round = {
            t: [x["rps"] / h["rps"] for h, x in zip(runs["h2load"], runs[t])] for t in others
        }
        row = {
            tool: {k: median([x[k] for x in rs]) for k in ("rps", "p50_us", "p99_us")}
            for tool, rs in runs.items()
        }
        ratio = {t: median(per_round[t]) for t in others}
        line = f"{n:>9}  {row['h2load']['rps']:>12.0f}"
        for t in others:
            line += f"  {row[t]['rps']:>14.0f}  {ratio[t]:>5.2f}"
        for t in tools:
            line += f"  {row[t]['p50_us']:>10.0f}us"
        for t in tools:
            line += f"  {row[t]['p99_us']:>10.0f}us"
        print(line)
        doc["levels"][str(n)] = {
            "median": row,
            "rate_ratio": ratio["tailmesh"],
            "rate_ratios": per_round["tailmesh"],
            "runs": runs,
        }
        if "h2lean" in others:
            doc["levels"][str(n)]["h2lean_rate_ratio"] = ratio["h2lean"]
            doc["levels"][str(n)]["h2lean_rate_ratios"] = per_round["h2lean"]
    print("ratio: the tool's rate / h2load's, median of the rounds' ratios (each round measures every tool)")
    doc["intervals"] = intervals_doc(d)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


def floor_ratios(h2, t):
    """One round's ratios, by the names the intervals table prints."""
    out = {}
    for traces in ("off", "on"):
        t1, t3 = t[("1", traces)], t[("3", traces)]
        cost = (t3["p50_us"] - t1["p50_us"]) / 2.0
        out[f"per-hop cost / h2load p50, traces {traces}"] = cost / h2["p50_us"]
        out[f"tailmesh 1-hop p50 / h2load p50, traces {traces}"] = t1["p50_us"] / h2["p50_us"]
    return out


def load_round(d, r):
    h2 = json.load(open(f"{d}/h2load-{r}.json"))
    t = {
        (chain, traces): json.load(open(f"{d}/t{chain}-{traces}-{r}.json"))
        for chain in ("1", "3")
        for traces in ("off", "on")
    }
    return h2, t


def cmd_floor_round(d, r, out):
    h2, t = load_round(d, r)
    if not h2["p50_us"]:
        fail(f"round {r}: h2load's p50 is 0 us: no ratio to it")
    write_values(out, floor_ratios(h2, t))


def write_values(out, ratios):
    with open(out, "w") as f:
        for name, value in ratios.items():
            f.write(f"{name}\t{value!r}\n")


def intervals_doc(d):
    path = f"{d}/intervals.json"
    return json.load(open(path)) if os.path.exists(path) else None


def cmd_report(d, rounds, json_out=None):
    rounds = int(rounds)
    runs = [load_round(d, r) for r in range(1, rounds + 1)]
    doc = {"rounds": rounds, "runs": []}
    rows = [("h2load -> 1 hop", [h2 for h2, _ in runs])]
    for traces in ("off", "on"):
        for chain in ("1", "3"):
            ts = [t[(chain, traces)] for _, t in runs]
            rows.append((f"{ts[0]['what']}, traces {traces}", ts))
    label = "per-hop cost (3-hop - 1-hop p50) / 2, traces off"
    w = max(len(r[0]) for r in rows + [(label,)])
    print(f"{'':<{w}}  {'p50':>8}  {'p99':>8}  {'req/s':>9}")
    for what, xs in rows:
        p50, p99, rps = (median([x[k] for x in xs]) for k in ("p50_us", "p99_us", "rps"))
        print(f"{what:<{w}}  {p50:>6.0f}us  {p99:>6.0f}us  {rps:>9.0f}")
    for traces in ("off", "on"):
        costs = [(t[("3", traces)]["p50_us"] - t[("1", traces)]["p50_us"]) / 2.0 for _, t in runs]
        print(f"{'per-hop cost (3-hop - 1-hop p50) / 2, traces ' + traces:<{w}}  {median(costs):>6.1f}us")
        doc[f"per_hop_cost_p50_us_traces_{traces}"] = median(costs)
    print("(medians of the rounds; the ratios below are read within each round)")
    h2 = runs[0][0]
    print(
        f"(h2load replies: {h2['data_bytes_per_request']:.0f} data bytes per request, "
        f"a real reply needs >= {h2['min_reply_bytes']})"
    )
    for r, (h2, t) in enumerate(runs, 1):
        doc["runs"].append(
            {
                "round": r,
                "h2load_1hop": h2,
                **{f"tailmesh_{c}hop_traces_{tr}": v for (c, tr), v in t.items()},
                "ratios": floor_ratios(h2, t),
            }
        )
    doc["intervals"] = intervals_doc(d)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


def main(argv):
    commands = {
        "body": (cmd_body, 1),
        "check-reply": (cmd_check_reply, 2),
        "h2load": (cmd_h2load, 5),
        "tailmesh": (cmd_tailmesh, 3),
        "load": (cmd_load, 3),
        "lean": (cmd_lean, 3),
        "floor-round": (cmd_floor_round, 3),
        "report": (cmd_report, None),
        "generator-round": (cmd_generator_round, 3),
        "generator-report": (cmd_generator_report, None),
    }
    if len(argv) < 2 or argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    fn, nargs = commands[argv[1]]
    args = argv[2:]
    if nargs is not None and len(args) != nargs:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    fn(*args)


if __name__ == "__main__":
    main(sys.argv)
