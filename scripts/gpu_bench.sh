#!/usr/bin/env bash
# Benchmark the shipped drafts on a lent GPU machine (see README "GPU"). `python -m scripts.gpu_stage` packs the
# converted weights, the evaluation clips and missing wheels into .devcarry/p1, p2, ...; each pack travels in
# its own call (`mkdir -p /tmp/stage && cp -r .devcarry/pN/. /tmp/stage/`) and this last call reassembles them.
set -euo pipefail
stage=/tmp/stage
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $stage/whl/*.whl
export PYTHONPATH=/tmp/site SPECASR_CACHE=/tmp/specasr-cache PYTHONUNBUFFERED=1
for folder in $stage/targets/*; do
    converted=$SPECASR_CACHE/targets/$(basename "$folder")
    mkdir -p "$converted"
    cp $(ls $folder/* | grep -v '\.part') "$converted"/
    cat $folder/model.part* > "$converted"/model.safetensors
    (cd "$converted" && sha256sum -c model.sha256)
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
for target in whisper-tiny.en whisper-base; do
    python3 -m scripts.evaluate_drafts --device cuda --dtype float16 --target $target --speech-dir $stage/speech \
        --clips ${CLIPS:-78} --repeats ${REPEATS:-3} --k 4 2>&1 | grep -v -E "Passing generation_config|Loading weights" \
        | tee -a ${OUT:-/tmp}/evaluate.txt
done
