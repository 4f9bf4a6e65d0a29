# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
B="python3 -m vtllm bench gpu --peers none --steps 32"
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
[ -d $M ] || python3 -m vtllm synth --shape qwen3-0.6b --out $M > /tmp/res/synth.txt 2>&1
# the GPU gates on the split of long steps' attention rows (ring kernel for the scratch's
# leading rows, prefill kernel for the rest; simulator-tested only)
T=600 step gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
# a mixed step (56 decodes, a 128-token prompt) waited 4,150 us a layer in attention before
# it (H100), 64 decodes alone 57 us; does a pure prefill lose anything (2048x1 attention was
# 1,494 us a layer on the H200, 2048x16 155 us; TTFT 128 6.3-8.0 ms, 1024 27.7-29.5)?
step mixed_56_128 python3 tools/device_profile_decode.py $M --batch 56 --context 256 --mixed 128
step decode_64 python3 tools/device_profile_decode.py $M --batch 64 --context 256
step prof_2048x1 python3 tools/device_profile_decode.py $M --prefill 2048 --seqs 1
step prof_2048x16 python3 tools/device_profile_decode.py $M --prefill 2048 --seqs 16
step ttft $B --shapes qwen3-0.6b --prompts 128,1024 --batches 1,64
# HTTP c64 with the step loop's time split (waited 8.6 ms a step on the device before)
T=900 step http env PY=python3 MODEL=$M VT_ARGS="--device cuda" HF_MODEL=$M \
  HF_ARGS="--device cuda --dtype bfloat16" SKIP_PEER=1 THREADS=16 CONCURRENCY=64 \
  OUT=/tmp/res/http bash loadtest/peers/compare_servers.sh
step http_table python3 loadtest/peers/compare_table.py /tmp/res/http --runs vtllm hf
# offline waves (bench throughput now keeps --device: it ran the CPU backend before)
step wave_c64 python3 -m vtllm bench throughput --device cuda --model $M --num-prompts 256 \
  --input-len 128 --output-len 64 --concurrency 64
