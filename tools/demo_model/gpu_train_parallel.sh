#!/usr/bin/env bash
# Trains several variants of the demo model at once, one per GPU, on a multi-GPU device machine (the same
# device minutes buy one run per GPU), from the repository root:
#   OUT=/some/dir DEMO_MINUTES=8.4 bash tools/demo_model/gpu_train_parallel.sh "FLAGS A" "FLAGS B" ...
# Each argument is one variant's extra train.py flags (through gpu_train.sh); variant i runs on GPU i.
# First (unless DEMO_TOY_CHECK=0) a one-minute toy run with variant 0's non-resume flags checks that train.py
# runs at all (a typo must not cost a whole call). The device machine returns at most 8 files, so each variant comes back as two:
#   $OUT/v<i>/unet.safetensors   the UNet weights (fp16, the largest file)
#   $OUT/v<i>/rest.tar           everything else gpu_train.sh wrote (text encoder, VAE, configs, log, stats,
#                                samples); unpack: tar -xf rest.tar -C DIR && mv unet.safetensors DIR/, then
#                                tools/demo_model/unpack.sh DIR models/demo
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
[ "$#" -ge 1 ] || { echo "usage: gpu_train_parallel.sh \"FLAGS\" [\"FLAGS\" ...]" >&2; exit 2; }
PY="${PYTHON:-python3}"
ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
[ "$ngpu" -ge "$#" ] || { echo "$# variants but $ngpu GPUs" >&2; exit 2; }
# The toy check: variant 0's flags without --resume DIR (the toy config cannot load the real model).
if [ "${DEMO_TOY_CHECK:-1}" != 0 ]; then
  toy_flags=$(echo "$1" | sed -E 's/--resume +[^ ]+//')
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=0 "$PY" -u tools/demo_model/train.py --toy --minutes 1.0 --out /tmp/demo_toy_check \
    --no-eval $toy_flags > /tmp/demo_toy_check.log 2>&1 || { tail -30 /tmp/demo_toy_check.log; exit 1; }
  echo "toy check passed"
fi
workers=$(( ($(nproc) - 2) / $# ))
i=0
for flags in "$@"; do
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$i OUT=/tmp/demo_variant$i DEMO_WORK=/tmp/demo_work$i \
    bash tools/demo_model/gpu_train.sh --workers "$workers" $flags > /tmp/demo_variant$i.log 2>&1 &
  i=$((i + 1))
done
wait
for ((i = 0; i < $#; i++)); do
  mkdir -p "$OUT/v$i"
  echo "== variant $i: $(eval echo "\${$((i + 1))}")"
  grep -E "adherence|unet done|resumed|Error|error" /tmp/demo_variant$i.log | tail -8
  [ -f /tmp/demo_variant$i/unet.safetensors ] && mv /tmp/demo_variant$i/unet.safetensors "$OUT/v$i/"
  cp /tmp/demo_variant$i.log /tmp/demo_variant$i/console.log
  tar -C /tmp/demo_variant$i -cf "$OUT/v$i/rest.tar" .
done
