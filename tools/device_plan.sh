# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
B="python3 -m vtllm bench gpu --peers none --steps 32"
F32="--kv-cache-dtype float32 --matmul-input-dtype float32"
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
# Qwen3-0.6B TTFT 128 was 13.6 ms with the defaults and 7.23 with float32 when the bf16 run
# came first: both orders, and the defaults twice
step ttft_bf16_a $B --shapes qwen3-0.6b --prompts 128,1024 --batches 1 --json /tmp/res/ttft_bf16_a.json
step ttft_f32 $B --shapes qwen3-0.6b --prompts 128,1024 --batches 1 $F32 --json /tmp/res/ttft_f32.json
step ttft_bf16_b $B --shapes qwen3-0.6b --prompts 128,1024 --batches 1 --json /tmp/res/ttft_bf16_b.json
# HTTP c64 with the step loop's time split (does the device wait on the host?)
T=900 step http env PY=python3 MODEL=$M VT_ARGS="--device cuda" HF_MODEL=$M \
  HF_ARGS="--device cuda --dtype bfloat16" SKIP_PEER=1 THREADS=16 CONCURRENCY=64 \
  OUT=/tmp/res/http bash loadtest/peers/compare_servers.sh
step http_table python3 loadtest/peers/compare_table.py /tmp/res/http --runs vtllm hf
# prefill of c64 waves offline, and where a 1,024-token prefill's time goes
step prefill_wave python3 -m vtllm bench throughput --device cuda --model $M --num-prompts 256 \
  --input-len 128 --output-len 1 --concurrency 64
step prof_q_prefill1024 python3 tools/device_profile_decode.py $M --prefill 1024
# batched decode at 4 to 16 rows end to end now that the ring kernel runs from 4 rows
step l_small $B --shapes llama3-8b --prompts 128 --batches 4,8,12,16
