#!/usr/bin/env bash
# CPU performance regression check (ctest label `perf`): the instructions callgrind counts in exactly one UNet
# call of the sd15-tiny fixture (tests/perf/unet_step_driver.cc), against bench/baseline/unet_step_instructions.txt.
# Instruction counts repeat exactly on a noisy, shared machine where wall times do not; the run is
# single-threaded (OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1) because thread scheduling changes spin-wait and
# work-split counts, and OpenBLAS's kernels are pinned (OPENBLAS_CORETYPE) so the CPU model does not choose them.
#
#   scripts/perf_check.sh [--build-dir DIR] [--baseline FILE] [--repeat N] [--tolerance PCT] [--measure]
#     --measure     print the count(s) (and their spread) without comparing; update_perf_baseline.sh uses it
# Exit status: 0 within tolerance (default +5%), 1 regression or failure, 77 skipped (the reason is printed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$root/build
baseline=$root/bench/baseline/unet_step_instructions.txt
repeat=1
tolerance=5
measure_only=0
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --tolerance) tolerance=$2; shift 2 ;;
    --measure) measure_only=1; shift ;;
    *) echo "perf_check: unknown argument $1" >&2; exit 1 ;;
  esac
done
fixtures=${ATELIER_FIXTURES:-$root/../shared/fixtures}
driver=$build_dir/tests/atelier_perf_unet_step
tag_file=$build_dir/perf_build_tag.txt
COUNTED_FUNCTION=atelier_perf_unet_call

skip() { echo "perf_check: SKIPPED: $*"; exit 77; }
command -v valgrind >/dev/null || skip "valgrind is not installed (scripts/setup.sh installs it)"
[[ -x $driver ]] || skip "the driver $driver is not built (ninja atelier_perf_unet_step)"
[[ -d $fixtures/sd15-tiny/model/unet ]] || skip "fixture sd15-tiny not found under $fixtures (set ATELIER_FIXTURES)"
build_tag=$(cat "$tag_file" 2>/dev/null || echo unknown)

# One callgrind run -> the instruction count (Ir) of the counted function, inclusive. The driver gets a fixed
# environment and fixed file descriptors: glibc malloc's paths in the counted call depend on the heap the
# process start left behind, and that moved by ~50k instructions with whether this script's output was a
# pipe or a file.
count_once() {
  local out err
  out=$(mktemp "${TMPDIR:-/tmp}/atelier_perf.XXXXXX")
  err=$(mktemp "${TMPDIR:-/tmp}/atelier_perf_err.XXXXXX")
  if ! env -i PATH="$PATH" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell \
      valgrind --tool=callgrind --collect-atstart=no --toggle-collect=$COUNTED_FUNCTION \
      --callgrind-out-file="$out" -q "$driver" "$fixtures/sd15-tiny/model" </dev/null >/dev/null 2>"$err"; then
    cat "$err" >&2
  fi
  # "summary:" (or "totals:") holds the collected events; Ir is the first.
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
  rm -f "$out" "$err"
}

counts=()
for ((i = 0; i < repeat; ++i)); do
  c=$(count_once)
  [[ $c =~ ^[0-9]+$ ]] || { echo "perf_check: no instruction count from callgrind (got '$c')"; exit 1; }
  counts+=("$c")
done
min=$(printf '%s\n' "${counts[@]}" | sort -n | head -1)
max=$(printf '%s\n' "${counts[@]}" | sort -n | tail -1)
echo "perf_check: one sd15-tiny UNet call: ${counts[*]} instructions (${repeat} run(s), spread $((max - min)))"
echo "perf_check: build $build_tag, $(valgrind --version)"
if ((measure_only)); then
  echo "instructions: $max"
  echo "spread: $((max - min))"
  exit 0
fi

[[ -f $baseline ]] || { echo "perf_check: no baseline $baseline: run scripts/update_perf_baseline.sh"; exit 1; }
base=$(awk '/^instructions:/ {print $2}' "$baseline")
base_tag=$(awk '/^# build:/ {print $3}' "$baseline")
[[ $base =~ ^[0-9]+$ ]] || { echo "perf_check: $baseline has no 'instructions: N' line"; exit 1; }
# Build type and -march=native change the code itself: a count from another configuration means nothing.
if [[ ${build_tag%%;compiler=*} != "${base_tag%%;compiler=*}" ]]; then
  skip "this build ($build_tag) is not the baseline's configuration ($base_tag)"
fi
[[ $build_tag == "$base_tag" ]] || echo "perf_check: warning: toolchain differs from the baseline's ($base_tag); a change may come from it"
pct=$(awk -v c="$max" -v b="$base" 'BEGIN {printf "%+.2f", 100 * (c - b) / b}')
echo "perf_check: baseline $base, now $max ($pct%), tolerance +$tolerance%"
if awk -v c="$max" -v b="$base" -v t="$tolerance" 'BEGIN {exit !(c > b * (1 + t / 100))}'; then
  echo "perf_check: FAILED: more than +$tolerance% instructions. If the increase is intended, run scripts/update_perf_baseline.sh and commit the baseline."
  exit 1
fi
if awk -v c="$max" -v b="$base" -v t="$tolerance" 'BEGIN {exit !(c < b * (1 - t / 100))}'; then
  echo "perf_check: note: more than $tolerance% below the baseline; lock the gain in with scripts/update_perf_baseline.sh"
fi
echo "perf_check: ok"
