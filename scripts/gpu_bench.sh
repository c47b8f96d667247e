#!/usr/bin/env bash
# Benchmark on a lent GPU machine (see README "GPU"). The converted weights arrive in parts over several
# calls (64 MiB per call) and wait in /tmp/specasr-parts; this last call reassembles them and runs the bench.
set -euo pipefail
carry=.devcarry
mkdir -p /tmp/specasr-parts && cp $carry/*.part* /tmp/specasr-parts/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $carry/whl/*.whl
export PYTHONPATH=/tmp/site SPECASR_CACHE=/tmp/specasr-cache PYTHONUNBUFFERED=1
for name in whisper-tiny.en whisper-base; do
    folder=$SPECASR_CACHE/targets/$name-v1
    mkdir -p "$folder"
    cp $carry/targets/$name/* "$folder"/
    cat /tmp/specasr-parts/$name.part* > "$folder/model.safetensors"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
for target in whisper-tiny.en whisper-base; do
    for dtype in float16 float32; do
        python3 -m specasr bench --device cuda --dtype $dtype --target $target --speech-dir $carry/speech \
            --clips 8 --repeats 5 --k 4 2>&1 | grep -v -E "Passing generation_config|Loading weights" | tee -a $OUT/bench.txt
    done
done
