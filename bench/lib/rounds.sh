# Shared by bench/floor.sh, generator.sh, tracing.sh and sidecar.sh
# (sourced, not run): rounds of interleaved variants, one value per ratio
# and round, snapshots of the machine between rounds, and the closing table
# of medians with bootstrap 95 % intervals and verdicts, each ratio's first
# half of the rounds tested against its second for drift (the `intervals`
# binary of tailmesh-bench, bench/src/rounds.rs).
#
# These machines move 20-60 % from one run to the next, so a script
# measures each variant once per round (A B C A B C ..., or A B B A ...
# with in_turn) and judges a goal on the interval of its ratio's median,
# never on one reading.
#
# After bench/lib/steps.sh and TMP: rounds_setup once, machine_mark before
# the first round and after each, in_turn ROUND A B to run a round's two
# variants, round_values FILE (lines NAME<TAB>VALUE) for each round, then
# rounds_report [--goal 'NAME<=X' ...] >FILE.

# Builds the intervals binary (release, as the scripts' other binaries).
rounds_setup() {
    local repo
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    say "cargo build --release -p tailmesh-bench --bin intervals"
    step TERM cargo build --manifest-path "$repo/Cargo.toml" --release --quiet \
        -p tailmesh-bench --bin intervals
    INTERVALS="$repo/target/release/intervals"
    : >"$TMP/rounds.tsv"
    : >"$TMP/machine.txt"
}

# A snapshot of the machine: /proc/stat's cpu line (steal) and the load
# average. Taken between rounds, so the report reads what the rounds met.
machine_mark() {
    { head -n1 /proc/stat; cat /proc/loadavg; } >>"$TMP/machine.txt" 2>/dev/null || true
}

# Appends one round's values (NAME<TAB>VALUE lines) from FILE.
round_values() {
    cat "$1" >>"$TMP/rounds.tsv"
}

# The table of medians [95 % interval], verdicts, steal and load on
# stdout; also $TMP/intervals.json. Arguments: --goal 'NAME<=X' ...
rounds_report() {
    "$INTERVALS" "$TMP/rounds.tsv" --machine "$TMP/machine.txt" --json "$TMP/intervals.json" "$@"
}

# Runs one round's two variants in turn: COMMAND_A first in odd rounds,
# COMMAND_B first in even ones, so that what a round's first run leaves
# to its second (warm caches, or the work of its exit) weighs on both
# alike. Arguments: ROUND COMMAND_A COMMAND_B
in_turn() {
    if (($1 % 2)); then
        "$2"
        "$3"
    else
        "$3"
        "$2"
    fi
}
