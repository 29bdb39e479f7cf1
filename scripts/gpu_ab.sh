#!/usr/bin/env bash
# A/B comparison: one `atelier bench` run under two or more environment settings, interleaved for ROUNDS rounds,
# each run's model-call median, energy per call, mean power, SM clock, s/image, VAE decode time and any cudaMalloc
# calls inside the timed run printed, then each setting's median of its runs. Interleaving matters on the lent
# H200s: a DiT step runs at the card's 700 W limit, its clock drifts with temperature within a call, and the cards
# differ by ~6% in clock and energy per step (docs/performance.md, session 18), so only settings compared in one
# call on one card, turn by turn, tell a change from the card.
#
#   bash .gpupack/gpu_ab.sh [-n ROUNDS] SETTING... -- BENCH_ARGS...
#     SETTING     NAME=VALUE[,NAME=VALUE...] environment for that variant, or - for none
#     BENCH_ARGS  `atelier bench` options (--device cuda unless given; --json is added)
#   e.g.  bash .gpupack/gpu_ab.sh -n 2 - ATELIER_FP8_ATTENTION=0 -- --config flux --fp8 --warmup 2
#
# Reports go to $OUT/ab (the device tool's return folder) or /tmp/gpu_ab. Energy needs a loop of a second or
# more (`--steps`): shorter runs print n/a there. Uses the pack's binary (gpu_bench_env.sh), else $BUILD_DIR's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
here=$(basename "$(dirname "$0")")
# shellcheck source=scripts/gpu_bench_env.sh disable=SC2154  # run, atelier
source "$here/gpu_bench_env.sh"
out=${OUT:-/tmp/gpu_ab}/ab
mkdir -p "$out"

rounds=2
if [[ ${1:-} == -n ]]; then
  rounds=$2
  shift 2
fi
settings=()
while [[ $# -gt 0 && $1 != -- ]]; do
  settings+=("$1")
  shift
done
[[ ${1:-} == -- ]] && shift
if [[ ${#settings[@]} -lt 1 || $# -lt 1 ]]; then
  echo "usage: gpu_ab.sh [-n ROUNDS] SETTING... -- BENCH_ARGS..." >&2
  exit 2
fi
args=("$@")
rm -f "$out"/v*_r*.json "$out"/v*_r*.err  # an earlier comparison's runs would join this one's medians
[[ " ${args[*]} " == *" --device "* ]] || args+=(--device cuda)

summary() {  # summary JSON LABEL: one line of figures
  /usr/bin/env python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
u = r.get("unet_ms", {})
f = lambda k, fmt: (fmt % r[k]) if r.get(k) is not None else "n/a"
st, c = r.get("stages_s", {}), r.get("timed_run_counters", {})
mallocs = f"  {c['cuda_mallocs']:.0f} cudaMalloc ({1e3 * c.get('cuda_malloc_seconds', 0):.1f} ms)" if c.get("cuda_mallocs") else ""
print(f"{sys.argv[2]:40s} median {u.get('median', 0):9.3f} ms  {f('energy_per_call_j', '%.2f')} J/call  "
      f"{f('mean_power_w', '%.0f')} W  {f('mean_sm_clock_mhz', '%.0f')} MHz  {f('s_per_image', '%.4f')} s/image  "
      f"VAE {1e3 * (st.get('vae_decode') or 0):.1f} ms{mallocs}")
PY
}

for ((round = 1; round <= rounds; ++round)); do
  for i in "${!settings[@]}"; do
    s=${settings[$i]}
    env_args=()
    [[ $s != - ]] && IFS=, read -r -a env_args <<< "$s"
    file="$out/v${i}_r$round.json"
    if ! env "${env_args[@]}" "${run[@]}" "$atelier" bench "${args[@]}" --json > "$file" 2> "$out/v${i}_r$round.err"; then
      echo "setting '$s', round $round: bench failed:"
      tail -3 "$out/v${i}_r$round.err"
      continue
    fi
    summary "$file" "[$round] $s"
  done
done

echo "--- median of each setting's runs"
/usr/bin/env python3 - "$out" "${settings[@]}" <<'PY'
import glob, json, statistics, sys
out, settings = sys.argv[1], sys.argv[2:]
for i, s in enumerate(settings):
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/v{i}_r*.json"))]
    ms = [r["unet_ms"]["median"] for r in runs if r.get("unet_ms")]
    j = [r["energy_per_call_j"] for r in runs if r.get("energy_per_call_j") is not None]
    text = f"{statistics.median(ms):.3f} ms over {len(ms)} runs" if ms else "no runs"
    if j: text += f", {statistics.median(j):.2f} J per call"
    print(f"{s:40s} {text}")
PY
