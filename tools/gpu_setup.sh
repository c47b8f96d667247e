# Sourced by the GPU job scripts: merges the final call's `last` pack into /tmp/stage (where the earlier calls put
# theirs), installs the carried wheels, joins and checks the carried files, and puts the converted weights, the
# training caches, the sentence corpus and the train-speech manifest where specasr looks for them.
stage=/tmp/stage
mkdir -p $stage && cp -r .devcarry/last/. $stage/
out=${OUT:-/tmp}
mkdir -p $out
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $stage/whl/*.whl
export PYTHONPATH=/tmp/site SPECASR_CACHE=/tmp/specasr-cache PYTHONUNBUFFERED=1
for sum in $(find $stage -name '*.sha256'); do  # join each file's pieces (tools/gpu_stage.py) and check it
    file=${sum%.sha256}
    cat "$file".part* > "$file"
    (cd "$(dirname "$file")" && sha256sum --check --quiet "$(basename "$sum")")
    rm "$file".part* "$sum"
done
mkdir -p $SPECASR_CACHE/targets && cp -r $stage/targets/. $SPECASR_CACHE/targets/
mkdir -p $SPECASR_CACHE/train && cp -r $stage/train/. $SPECASR_CACHE/train/
data=$(python3 -c "from specasr.dataset import SHARED_DATA; print(SHARED_DATA)")
mkdir -p "$data/text" && cp $stage/text/sentences.txt "$data/text/"
if [ -d $stage/train-speech ]; then mkdir -p "$data/train-speech" && cp $stage/train-speech/manifest.tsv "$data/train-speech/"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
quiet="Passing generation_config|Loading weights"
