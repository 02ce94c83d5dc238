#!/usr/bin/env bash
# `make install` from nothing: this commit's Makefile against another revision's, in fresh clones, alternating
# over rounds (a slow phase of a shared box hits both). Prints a markdown section; makes it this script's section of RESULTS.md
# unless NO_APPEND=1.
#
#   benchmarks/pipeline/bench_install.sh [BASE_REV (default ac0844d: pip compiling one module at a time)] [ROUNDS (2)]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
base=${1:-ac0844d}
rounds=${2:-2}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
declare -A times=([HEAD]="" [$base]="")
for ((r = 0; r < rounds; r++)); do
  order=(HEAD "$base"); ((r % 2)) && order=("$base" HEAD)
  for rev in "${order[@]}"; do
    dir="$scratch/$rev-$r"
    git clone -q "$repo" "$dir" && git -C "$dir" checkout -q "$rev"
    start=$(date +%s%N)
    make -C "$dir" install > "$dir.log" 2>&1
    times[$rev]+="$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}') "
    echo "$rev round $r: $(echo "${times[$rev]}" | awk '{print $NF}') s" >&2
    rm -rf "$dir"
  done
done
row() { echo "$1" | tr ' ' '\n' | grep . | sort -n | awk -v rev="$2" '{a[NR]=$1} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
  printf "| %s | %.1f | %.1f-%.1f |\n", rev, m, a[1], a[NR]}'; }
text="## make install from nothing: this Makefile vs $base's ($(date +%F), $(uname -m) $(nproc) cores)

\`benchmarks/pipeline/bench_install.sh $base $rounds\`: fresh clones, \`make install\` (venv, torch, \`pip install -e .[dev]\`,
byte-compilation), $rounds rounds in alternating order.

| revision | seconds (median) | range |
| --- | ---: | --- |
$(row "${times[HEAD]}" "HEAD ($(git -C "$repo" rev-parse --short HEAD))")
$(row "${times[$base]}" "$base")"
echo "$text"
[ "${NO_APPEND:-0}" = 1 ] || printf '%s\n' "$text" | python3 "$repo/benchmarks/harness/publish.py" "$repo/benchmarks/pipeline/bench_install.sh" > /dev/null
