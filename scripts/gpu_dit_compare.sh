#!/usr/bin/env bash
# On a GPU machine (after gpu_check.sh unpacked the pack, or with BUILD_DIR set): the DiT benches of
# gpu_dit_bench.sh against an execution switch, off in one run of the same build —
#   ATELIER_FP8_ATTENTION=0    FP8 blocks with 16-bit attention instead of FP8 attention (cuDNN's FP8 graph)
# and SD 1.5 batch 1 / 8 (SD=0 skips them). Then the eager op breakdowns of a FLUX step (bf16 and FP8, GEMMs by
# shape) and an Nsight Compute profile of the glue kernels (NCU=0 skips it). Reports in $OUT (default
# /tmp/gpu_bench: the device tool returns a limited number of files, so a call may point OUT elsewhere and copy
# back the .txt summaries and the log).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source "$here/gpu_bench_env.sh"

bench flux_1024_fp8 --config flux --warmup 2 --fp8
ATELIER_FP8_ATTENTION=0 bench flux_1024_fp8_attn16 --config flux --warmup 2 --fp8
bench flux_1024 --config flux --warmup 2
bench zimage_1024_fp8 --config zimage --warmup 2 --fp8
ATELIER_FP8_ATTENTION=0 bench zimage_1024_fp8_attn16 --config zimage --warmup 2 --fp8
bench zimage_1024 --config zimage --warmup 2
if [[ ${SD:-1} != 0 ]]; then
  bench sd15_b1 --config sd15 --steps 20 --warmup 2
  bench sd15_b8 --config sd15 --steps 10 --batch 8 --warmup 2
fi
# Op breakdown of an eager FLUX step (GEMMs by shape).
for v in "" _fp8; do
  flag=${v:+--fp8}
  gemm=linear
  [[ -n $v ]] && gemm=linear_fp8
  ATELIER_GRAPHS=0 bench flux${v}_trace --config flux --steps 2 --warmup 1 $flag --trace "$out/flux${v}_events.trace.json"
  /usr/bin/env python3 bench/trace_ops.py "$out/flux${v}_events.trace.json" --call model_call > "$out/flux${v}_ops.txt" 2>&1
  /usr/bin/env python3 bench/trace_ops.py "$out/flux${v}_events.trace.json" --call model_call --shapes $gemm --top 40 \
    > "$out/flux${v}_gemm_shapes.txt" 2>&1
  head -16 "$out/flux${v}_ops.txt"
  rm -f "$out/flux${v}_events.trace.json"
done
# Memory-bound glue kernels of one eager FP8 FLUX step under Nsight Compute (time and DRAM throughput each):
# which passes run below the bandwidth.
if [[ ${NCU:-1} == 0 ]]; then
  echo "NCU=0: no kernel profile"
elif command -v ncu > /dev/null || [[ -x /usr/local/cuda/bin/ncu ]]; then
  ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  ATELIER_GRAPHS=0 ATELIER_CUDA_PROFILE_RANGE=model_call:1 timeout 240 "${run[@]}" "$ncu_bin" --profile-from-start off \
    --clock-control none --cache-control none -k 'regex:rope_|norm_modulate|quantize_rows|copy_|fp8_' --csv \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum \
    "$atelier" bench --device cuda --config flux --fp8 --steps 1 --warmup 1 --trace "$out/ncu_flux.trace.json" \
    > "$out/ncu_flux_glue.csv" 2> "$out/ncu_flux_glue.err"
  /usr/bin/env python3 bench/ncu_summary.py "$out/ncu_flux_glue.csv" --top 30 > "$out/ncu_flux_glue.txt" 2>&1
  head -40 "$out/ncu_flux_glue.txt"
  rm -f "$out/ncu_flux.trace.json"
else
  echo "ncu not found: no kernel profile"
fi
