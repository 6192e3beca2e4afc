#!/usr/bin/env bash
# tranche-bench/versus.sh: `tranche run` side by side with the baseline script
# (`../shared/bench/py_reference.py`, or BASELINE=path) on the same input, against one
# `tranche sim`, in one sitting: CPU seconds (user + system), wall seconds, peak RSS and how many
# requests succeeded, for each run, then each side's mean and the ratio of the means.
#
#   crates/tranche-bench/versus.sh 100000            # 3 runs of each, alternating
#   RUNS=5 SPEED=10000 crates/tranche-bench/versus.sh 1000000
#   KEYS=random crates/tranche-bench/versus.sh 100000   # keys that do not follow input order
#   TRANCHE=path/to/other/tranche crates/tranche-bench/versus.sh 100000
#   POSTGRES=postgres://postgres@127.0.0.1:5432 crates/tranche-bench/versus.sh 100000
#
# With POSTGRES (a server URL without a database), each tranche run gets a new database there
# (created before the run, dropped after) and the table gains the server's CPU seconds over the
# run: what the PostgreSQL processes of this machine spent, the ones that ended included (read
# from /proc: every `postgres` process's own time, and the postmaster's time of its reaped
# children). The server should be doing nothing else meanwhile.
#
# Input lines are tranche lines (`{"key", "body"}`) of about 880 bytes, one gpt-4o-mini chat
# request each, from a seeded generator: the same file for both sides and for every sitting.
# The baseline runs in a virtualenv with the `openai` package, made under the work folder on
# first use. Inputs and the virtualenv stay in VERSUS_DIR (default: target/bench-versus) for
# the next sitting; each run's database and results are removed after it.
set -euo pipefail
cd "$(dirname "$0")/../.."

n="${1:?usage: versus.sh REQUESTS (e.g. 100000)}"
runs="${RUNS:-3}"
speed="${SPEED:-100000}"
keys="${KEYS:-order}"
postgres="${POSTGRES:-}"
dir="${VERSUS_DIR:-$PWD/target/bench-versus}"
baseline="${BASELINE:-$PWD/../shared/bench/py_reference.py}"
tranche="${TRANCHE:-$PWD/target/release/tranche}"

[ -x /usr/bin/time ] || { echo "versus.sh: needs GNU time at /usr/bin/time" >&2; exit 1; }
if [ ! -f "$baseline" ]; then
    echo "versus.sh: no baseline script at $baseline (set BASELINE)" >&2
    exit 1
fi
case "$keys" in order | random) ;; *) echo "versus.sh: KEYS is order or random" >&2; exit 1 ;; esac
mkdir -p "$dir"
if [ -z "${TRANCHE:-}" ]; then
    cargo build --release -p tranche
fi
if [ ! -x "$dir/venv/bin/python" ]; then
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/pip" install --quiet openai
fi

input="$dir/input-$n-$keys.jsonl"
if [ ! -f "$input" ]; then
    python3 - "$n" "$keys" "$input.part" <<'EOF'
import json, random, sys
n, keys, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rng = random.Random(7)
words = "the of and to in is for on that with as by at from be this are an or it".split()
with open(out, "w") as f:
    for i in range(n):
        text = " ".join(rng.choice(words) for _ in range(260))[:760]
        key = "%016x" % rng.getrandbits(64) if keys == "random" else "k%07d" % i
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}],
                "max_tokens": 64}
        f.write(json.dumps({"key": key, "body": body}) + "\n")
EOF
    mv "$input.part" "$input"
fi

work="$(mktemp -d "$dir/sitting.XXXXXX")"
sim_pid=""
cleanup() {
    [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The simulator on a free port, read back from its log.
"$tranche" sim --port 0 --speed "$speed" --data-dir "$work/sim" >"$work/sim.log" 2>&1 &
sim_pid=$!
port=""
for _ in $(seq 100); do
    port="$(grep -o '127\.0\.0\.1:[0-9]*' "$work/sim.log" | head -1 | cut -d: -f2 || true)"
    [ -n "$port" ] && break
    sleep 0.1
done
if [ -z "$port" ]; then
    echo "versus.sh: the simulator did not start:" >&2
    cat "$work/sim.log" >&2
    exit 1
fi
url="http://127.0.0.1:$port/v1"

# One run in its own folder: "cpu wall rss_mb ok", from /usr/bin/time and the run's own
# count of successes.
run_script() {
    local d="$1"
    mkdir -p "$d"
    /usr/bin/time -f "%e %U %S %M" -o "$d/time" "$dir/venv/bin/python" "$baseline" "$input" "$url" \
        --db "$d/ref.db" >"$d/out" 2>"$d/err" || {
        cat "$d/err" >&2
        # The script uploads its files to expire after 14 days of the simulator's clock and
        # deletes each only once every batch has ended: a slow run outlives them (at --speed
        # 100000, 14 days pass in 12 s).
        if grep -q "No such File object" "$d/err"; then
            echo "versus.sh: the script's files expired before it deleted them (14 days of" \
                "the simulator's clock: $((1209600 / speed)) s at --speed $speed); run again" \
                "with a lower SPEED" >&2
        fi
        exit 1
    }
    local ok
    # The script's last line is its summary, in JSON.
    ok="$(tail -1 "$d/out" | python3 -c 'import json, sys; print(json.load(sys.stdin)["succeeded"])')"
    report "$d" "$ok"
}
run_tranche() {
    local d="$1"
    mkdir -p "$d"
    local db=() before=0
    if [ -n "$postgres" ]; then
        local name
        name="tranche_versus_$(basename "$d" | tr -c 'a-z0-9\n' '_')"
        PGOPTIONS="--client-min-messages=warning" psql "$postgres/postgres" -qAt \
            -c "DROP DATABASE IF EXISTS $name" -c "CREATE DATABASE $name"
        db=(--db "$postgres/$name")
        before="$(server_ticks)"
    fi
    OPENAI_API_KEY=sk-versus /usr/bin/time -f "%e %U %S %M" -o "$d/time" "$tranche" run "$input" \
        "${db[@]}" --data-dir "$d/data" --task ref --base-url "$url" --poll-interval 0.2 \
        --out "$d/r.jsonl" >"$d/out" 2>"$d/err" || { cat "$d/err" >&2; exit 1; }
    local ok server=""
    ok="$(grep -c '"status":"succeeded"' "$d/r.jsonl" || true)"
    if [ -n "$postgres" ]; then
        server="$(awk -v a="$before" -v b="$(server_ticks)" -v hz="$(getconf CLK_TCK)" \
            'BEGIN { printf "%.2f", (b - a) / hz }')"
        psql "$postgres/postgres" -qAtc "DROP DATABASE $name"
    fi
    report "$d" "$ok" "$server"
}

# CPU clock ticks the PostgreSQL server has spent: every `postgres` process's user and system
# time, and the postmaster's (the oldest) time of the children it reaped, which keeps the time
# of connections that have ended.
server_ticks() {
    local total=0 pid first=1 fields
    for pid in $(pgrep -o -x postgres) $(pgrep -x postgres); do
        # Fields after the command's closing parenthesis: utime is the 12th, cutime the 14th.
        fields="$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null)" || continue
        if [ "$first" = 1 ]; then
            total=$((total + $(echo "$fields" | awk '{ print $14 + $15 }')))
            first=0
        else
            total=$((total + $(echo "$fields" | awk '{ print $12 + $13 }')))
        fi
    done
    echo "$total"
}
report() {
    local e u s m
    read -r e u s m <"$1/time"
    echo "$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.2f", u + s }') $e $((m / 1024)) $2 ${3:-}"
}

echo "versus.sh: $n requests ($keys keys), $runs runs each, tranche sim --speed $speed" \
    "${postgres:+(tranche on PostgreSQL)}"
printf '%-8s %8s %8s %8s %10s %9s\n' side cpu_s wall_s rss_mb succeeded server_s
script_cpu=()
tranche_cpu=()
server_cpu=()
# Runs one side once in its own folder, prints its row and keeps its CPU seconds. The folder is
# removed and the disk synced before the next run starts, so that one run's writeback does not
# land in the next one's time.
run_side() {
    local side="$1" d="$work/$1-$2" c w m ok server
    "run_$side" "$d" >"$work/line"
    read -r c w m ok server <"$work/line"
    rm -rf "$d"
    sync
    printf '%-8s %8s %8s %8s %10s %9s\n' "$side" "$c" "$w" "$m" "$ok" "${server:-}"
    case "$side" in
        script) script_cpu+=("$c") ;;
        tranche) tranche_cpu+=("$c") server_cpu+=("${server:-0}") ;;
    esac
}
for i in $(seq "$runs"); do
    run_side script "$i"
    run_side tranche "$i"
done
mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.2f", s / NR }'; }
s="$(mean "${script_cpu[@]}")"
t="$(mean "${tranche_cpu[@]}")"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "mean CPU-s: script $s, tranche $t; script / tranche = $(ratio "$s" "$t")x"
if [ -n "$postgres" ]; then
    p="$(mean "${server_cpu[@]}")"
    both="$(awk -v t="$t" -v p="$p" 'BEGIN { printf "%.2f", t + p }')"
    echo "mean CPU-s of the PostgreSQL server over a tranche run: $p;" \
        "script / (tranche + server) = $(ratio "$s" "$both")x"
fi
