#!/usr/bin/env bash
# Benchmark the shipped drafts and time draft training on a lent GPU machine (see README "GPU").
# `python -m scripts.gpu_stage` packs the converted weights, the evaluation clips, missing wheels, one shard of
# training features and the sentence corpus into .devcarry/p1, p2, ... and .devcarry/last; each pN travels in a
# call of its own (`mkdir -p /tmp/stage && cp -r .devcarry/pN/. /tmp/stage/`) and this final call, carrying
# `last`, reassembles them.
set -euo pipefail
stage=/tmp/stage
mkdir -p $stage && cp -r .devcarry/last/. $stage/
out=${OUT:-/tmp}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $stage/whl/*.whl
export PYTHONPATH=/tmp/site SPECASR_CACHE=/tmp/specasr-cache PYTHONUNBUFFERED=1
for folder in $stage/targets/*; do
    converted=$SPECASR_CACHE/targets/$(basename "$folder")
    mkdir -p "$converted"
    cp $(ls $folder/* | grep -v '\.part') "$converted"/
    cat $folder/model.part* > "$converted"/model.safetensors
    (cd "$converted" && sha256sum -c model.sha256)
done
mkdir -p $SPECASR_CACHE/train && cp -r $stage/train/. $SPECASR_CACHE/train/
text=$(python3 -c "from specasr.trainset import SENTENCES; print(SENTENCES.parent)")
mkdir -p "$text" && cp $stage/text/sentences.txt "$text"/
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
quiet="Passing generation_config|Loading weights"
for run in ${RUNS:-4:2 2:1}; do  # K:repeats
    for target in whisper-tiny.en whisper-base; do
        python3 -m scripts.evaluate_drafts --device cuda --dtype float16 --target $target --speech-dir $stage/speech \
            --clips ${CLIPS:-78} --k ${run%:*} --repeats ${run#*:} 2>&1 | grep -v -E "$quiet" | tee -a $out/evaluate.txt \
            || echo "FAILED: $target $run"
    done
done
start=$(date +%s.%N)
python3 -m specasr train --target whisper-tiny.en --device cuda --variant anchordraft --real 0 --espeak 0 \
    --hibari 64 --epochs 20 --out /tmp/gpu-train 2>&1 | tr '\r' '\n' | grep -E "epoch 20/20|trained on" | tail -2 \
    | tee -a $out/train.txt || echo "FAILED: train"
echo "train wall $(python3 -c "import time; print(round(time.time() - $start, 1))") s" | tee -a $out/train.txt
