#!/usr/bin/env bash
# Train tiny.en's three drafts on a lent GPU machine from the carried feature cache (README, "GPU host") and time
# each run; the drafts come back in $OUT/drafts. `python -m tools.gpu_stage --job train --packs 7` packs the
# weights, the cache, missing wheels, the corpus and the train-speech manifest; each pN travels in a call of its
# own (`mkdir -p /tmp/stage && cp -r .devcarry/pN/. /tmp/stage/`) and this final call, carrying `last`, trains.
set -euo pipefail
source tools/gpu_setup.sh
epochs=${EPOCHS:-20}
for variant in ${VARIANTS:-anchordraft control no-audio}; do
    start=$(date +%s.%N)
    python3 -m specasr train --target whisper-tiny.en --device cuda --variant $variant --epochs $epochs \
        --out /tmp/gpu-drafts/$variant 2>&1 | tr '\r' '\n' | grep -E "epoch $epochs/$epochs|trained on" | tail -2 \
        | tee -a $out/train.txt || echo "FAILED: train $variant" | tee -a $out/train.txt
    echo "$variant wall $(python3 -c "import time; print(round(time.time() - $start, 1))") s" | tee -a $out/train.txt
    mkdir -p $out/drafts/whisper-tiny.en/$variant
    cp /tmp/gpu-drafts/$variant/config.json /tmp/gpu-drafts/$variant/draft.safetensors $out/drafts/whisper-tiny.en/$variant/ || true
done
