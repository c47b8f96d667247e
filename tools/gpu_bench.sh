#!/usr/bin/env bash
# Check CUDA graph replays against eager steps, benchmark the shipped drafts, time them beside the peer decoders, profile a round, check float16 / bfloat16
# against float32 greedy and time draft training on a lent GPU machine (README, "GPU host").
# `python -m tools.gpu_stage` packs the converted weights, the evaluation clips, missing wheels, one shard of
# training features and the sentence corpus into .devcarry/p1, p2, ... and .devcarry/last; each pN travels in a
# call of its own (`mkdir -p /tmp/stage && cp -r .devcarry/pN/. /tmp/stage/`) and this final call, carrying
# `last`, reassembles them.
set -euo pipefail
source tools/gpu_setup.sh
python3 -m pytest -q tests/test_graphs.py 2>&1 | tail -3 | tee -a $out/graphs.txt || echo "FAILED: graphs"  # replay == eager
for run in ${RUNS:-4:2 2:1}; do  # K:repeats
    for target in whisper-tiny.en whisper-base; do
        python3 -m specasr experiment --device cuda --dtype float16 --target $target --draft shipped \
            --data $stage/speech --clips ${CLIPS:-78} --k ${run%:*} --repeats ${run#*:} --db $out/runs.duckdb 2>&1 \
            | grep -v -E "$quiet" | tee -a $out/evaluate.txt || echo "FAILED: $target $run"
    done
done
peers=transformers,transformers-assisted  # faster-whisper too where its wheels were staged (.whl: faster-whisper, ctranslate2)
python3 -c "import faster_whisper" 2>/dev/null && peers=faster-whisper,$peers
clip=$(ls $stage/speech/audio/* | head -1)
for target in whisper-tiny.en whisper-base; do
    python3 -m specasr bench --device cuda --dtype float16 --target $target --draft shipped --peers $peers \
        --speech-dir $stage/speech --clips ${BENCH_CLIPS:-20} --repeats 3 --db $out/runs.duckdb 2>&1 \
        | grep -v -E "$quiet" | tee -a $out/peers.txt || echo "FAILED: peers $target"
    python3 -m specasr profile "$clip" --device cuda --dtype float16 --target $target \
        --draft $target/anchordraft --k 4 2>&1 | grep -v -E "$quiet|profiler_st" | tee -a $out/profile.txt \
        || echo "FAILED: profile $target"
    python3 -m specasr precision --device cuda --target $target --draft $target/anchordraft --k 2 \
        --low float16,bfloat16 --data $stage/speech --clips ${CLIPS:-78} 2>&1 | grep -v -E "$quiet" \
        | tee -a $out/precision.txt || echo "FAILED: precision $target"
done
start=$(date +%s.%N)
python3 -m specasr train --target whisper-tiny.en --device cuda --variant anchordraft --real 0 --espeak 0 \
    --hibari 64 --epochs 20 --out /tmp/gpu-train 2>&1 | tr '\r' '\n' | grep -E "epoch 20/20|trained on" | tail -2 \
    | tee -a $out/train.txt || echo "FAILED: train"
echo "train wall $(python3 -c "import time; print(round(time.time() - $start, 1))") s" | tee -a $out/train.txt
