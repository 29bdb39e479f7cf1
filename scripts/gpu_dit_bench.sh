#!/usr/bin/env bash
# On a GPU machine: `atelier bench` on the built-in full-size FLUX.1-dev (28 steps) and Z-Image-Turbo (8 steps)
# configurations at 1024², in bf16 and with the transformer blocks in FP8 (--fp8), plus a traced step of each
# (op breakdown through bench/trace_ops.py). Called by gpu_bench.sh; alone (after gpu_check.sh unpacked the
# pack, or with BUILD_DIR set): OUT=/dir bash scripts/gpu_dit_bench.sh. JSON reports and logs go to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source "$here/gpu_bench_env.sh"

for c in flux zimage; do
  bench ${c}_1024 --config $c --warmup 2
  bench ${c}_1024_fp8 --config $c --warmup 2 --fp8
done
# Where a traced step spends its device time (eager, graphs off: a replay is one range; tracing adds a
# little), bf16 and fp8.
for c in flux zimage; do
  for v in "" _fp8; do
    flag=${v:+--fp8}
    ATELIER_GRAPHS=0 bench ${c}${v}_trace --config $c --steps 2 --warmup 1 $flag --trace "$out/${c}${v}_events.trace.json"
    /usr/bin/env python3 bench/trace_ops.py "$out/${c}${v}_events.trace.json" --call model_call > "$out/${c}${v}_ops.txt" 2>&1
    # The GEMMs by operand shapes (which fall short of the ceiling).
    gemm=linear
    [[ -n $v ]] && gemm=linear_fp8
    /usr/bin/env python3 bench/trace_ops.py "$out/${c}${v}_events.trace.json" --call model_call --shapes $gemm --top 40 \
      > "$out/${c}${v}_gemm_shapes.txt" 2>&1
    head -14 "$out/${c}${v}_ops.txt"
  done
done
