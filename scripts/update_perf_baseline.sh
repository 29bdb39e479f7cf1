#!/usr/bin/env bash
# Re-records bench/baseline/unet_step_instructions.txt (the perf check's baseline) from this build, on purpose:
# after a change that is meant to cost (or save) instructions, or when the CI toolchain changes. Runs the
# count 3 times and refuses to write when the runs disagree. Commit the file with the change that moved it.
#   scripts/update_perf_baseline.sh [BUILD_DIR]      (default: build; configure it as CI does: Release)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-$root/build}
baseline=$root/bench/baseline/unet_step_instructions.txt
cmake --build "$build_dir" --target atelier_perf_unet_step
set +e
result=$("$root/scripts/perf_check.sh" --build-dir "$build_dir" --measure --repeat 3)
rc=$?
set -e
echo "$result"
((rc == 0)) || { echo "update_perf_baseline: the measurement did not run (status $rc)"; exit 1; }
count=$(awk '/^instructions:/ {print $2}' <<<"$result")
spread=$(awk '/^spread:/ {print $2}' <<<"$result")
((spread == 0)) || echo "update_perf_baseline: warning: the 3 runs differ by $spread instructions; recording the largest"
mkdir -p "$(dirname "$baseline")"
cat >"$baseline" <<TXT
# Instructions (callgrind Ir) of one sd15-tiny UNet call, batch 2, 16x16 latent (tests/perf/unet_step_driver.cc),
# single-threaded, OPENBLAS_CORETYPE=Haswell. Checked by scripts/perf_check.sh (ctest -L perf, fails above +5%);
# re-record on purpose with scripts/update_perf_baseline.sh.
# build: $(cat "$build_dir/perf_build_tag.txt")
# recorded: $(date +%F) with $(valgrind --version), 3 runs, spread $spread
instructions: $count
TXT
echo "update_perf_baseline: wrote $baseline"
