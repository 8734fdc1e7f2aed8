#!/bin/bash
# The default job whole, as the README starts it, 2 threads, nothing else running: bf16 compute
# with float32 logits (the default under bf16), then float32, seed 0, under GNU time (peak memory).
set -e
out=${1:-/tmp/whole-bf16}
for dt in bfloat16 float32; do
  /usr/bin/time -v freshper train --model.dtype "$dt" --train.run_dir "$out" --train.name "$dt" \
    > "$out-$dt.stdout" 2> "$out-$dt.time"
done
