#!/usr/bin/env bash
# The last call of a GPU job (tools/gpu_stage.py): join the pieces the earlier calls left in /tmp/stage, check and
# unpack them, install the carried wheels, put weights, drafts and caches where specasr looks, and run the job.
# Logs go to $OUT; the tables print last.
#   bash tools/gpu_job.sh [float16|float32|2x2|trees|compile|dashboard]
# float16: the CUDA graph tests, then per target the peers bench (graphed and eager greedy, generate, assisted, the
#   shipped drafts at K 2,4,8; ms/token, host share, agreement with float32 greedy), then a 30 s clip's phases.
# float32: per target, graphed greedy against eager greedy, generate and one draft, token for token.
# 2x2: the tiny.en training 2x2 (tools/gpu_2x2.py) from a stage made by tools/gpu_stage.py --job 2x2.
# trees: the CUDA graph tests (chains and trees), then per target the control draft's chains against draft trees of
#   width 4 and 8 or 16 nodes at K 2,4,8, captured, float16, against graphed greedy (20 clips x 3).
# dashboard: the concurrency tests, then per target Live decode on CUDA through AppTest: a 30 s clip's tokens against
#   the command line's, seconds from Run to the page's first view, and two sessions pressing Run at once.
# compile: the CUDA graph and compile tests, then per target greedy compiled, plain and eager beside the control
#   draft's chain and a width-4 tree of 8 nodes at K=4, compiled and captured, float16 (20 clips x 3).
set -uo pipefail
job=${1:-float16}
stage=/tmp/stage out=${OUT:-/tmp/out}
mkdir -p $stage $out && cp .devcarry/p*/* $stage/
(cd $stage && cat stage.tar.gz.* > stage.tar.gz && sha256sum --check stage.sha256 && tar xzf stage.tar.gz) || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $stage/whl/*.whl
export PYTHONPATH=/tmp/site SPECASR_CACHE=/tmp/specasr-cache PYTHONUNBUFFERED=1
mkdir -p $SPECASR_CACHE && cp -r $stage/targets $SPECASR_CACHE/
[ -d $stage/drafts ] && mkdir -p drafts && cp -r $stage/drafts/. drafts/  # the calls carry the tree without them
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
python3 -c "import torch, transformers, sys; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"

if [ "$job" = 2x2 ]; then
    PYTHONPATH=$stage/code:/tmp/site python3 $stage/code/tools/gpu_2x2.py --stage $stage --out $out --epochs 16 --budget 420 2>>$out/log.txt
    exit
fi
if [ "$job" = dashboard ]; then  # Live decode on CUDA through AppTest (tools/gpu_dashboard.py)
    python3 -m venv --system-site-packages /tmp/venv  # only what the image lacks comes from the carried wheels
    /tmp/venv/bin/pip install -q --no-index --find-links $stage/whl-dashboard streamlit pocketsphinx 2>>$out/log.txt
    /tmp/venv/bin/python -m pytest -q --tb=short -p no:cacheprovider tests/test_concurrency.py >$out/concurrency.txt 2>&1
    tail -3 $out/concurrency.txt
    for target in whisper-tiny.en whisper-base; do
        /tmp/venv/bin/python tools/gpu_dashboard.py $stage/long/audio/long-30s.flac --target $target \
            --draft $target/anchordraft --out $out/$target-dashboard.json 2>>$out/log.txt || tail -20 $out/log.txt
    done
    exit
fi
if [ "$job" = trees ]; then
    python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_graphs.py tests/test_tree.py -k "replays or tree" \
        >$out/graphs.txt 2>&1
    tail -3 $out/graphs.txt
    for target in whisper-tiny.en whisper-base; do
        python3 -m specasr bench --device cuda --dtype float16 --draft-dtype float16 --target $target \
            --draft $target/control --k 2,4,8 --tree-width 1,4 --tree-nodes 8,16 --speech-dir $stage/speech \
            --clips 20 --repeats 3 --db $out/runs.duckdb --json 2>>$out/log.txt >$out/$target-trees.json \
            || tail -20 $out/log.txt
    done
    python3 tools/gpu_tables.py $out/whisper-tiny.en-trees.json $out/whisper-base-trees.json | tee $out/tables.txt
    exit
fi
if [ "$job" = compile ]; then
    python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_graphs.py tests/test_compile.py -k "replays or compiled" \
        >$out/graphs.txt 2>&1
    tail -3 $out/graphs.txt
    for target in whisper-tiny.en whisper-base; do
        python3 -m specasr bench --device cuda --dtype float16 --draft-dtype float16 --target $target --compile \
            --draft $target/control --k 4 --tree-width 1,4 --tree-nodes 8 --speech-dir $stage/speech \
            --clips 20 --repeats 3 --db $out/runs.duckdb --json 2>>$out/log.txt >$out/$target-compile.json \
            || tail -20 $out/log.txt
    done
    python3 tools/gpu_tables.py $out/whisper-tiny.en-compile.json $out/whisper-base-compile.json | tee $out/tables.txt
    exit
fi
if [ "$job" = float32 ]; then
    for target in whisper-tiny.en whisper-base; do
        python3 -m specasr bench --device cuda --target $target --draft $target/anchordraft --k 4 --peers transformers \
            --speech-dir $stage/speech --clips 20 --repeats 1 --no-store --json 2>>$out/log.txt >>$out/float32.json
    done
    python3 tools/gpu_tables.py $out/float32.json | tee $out/tables.txt
    exit
fi
python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_graphs.py -k "replays" >$out/graphs.txt 2>&1
tail -3 $out/graphs.txt
for target in whisper-tiny.en whisper-base; do
    python3 -m specasr bench --device cuda --dtype float16 --draft-dtype float16 --target $target --draft shipped \
        --k 2,4,8 --peers transformers,transformers-assisted --speech-dir $stage/speech --clips 20 --repeats 3 \
        --db $out/runs.duckdb --json 2>>$out/log.txt >$out/$target.json || tail -20 $out/log.txt
done
for target in whisper-tiny.en whisper-base; do  # one 30 s window, waveform to text
    python3 -m specasr bench --device cuda --dtype float16 --draft-dtype float16 --target $target \
        --draft $target/anchordraft --k 4 --speech-dir $stage/long --clips 1 --repeats 5 --no-store --json \
        2>>$out/log.txt >>$out/long.json || tail -20 $out/log.txt
done
python3 tools/gpu_tables.py $out/whisper-tiny.en.json $out/whisper-base.json $out/long.json | tee $out/tables.txt
