# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
[ -d $M ] || python3 -m vtllm synth --shape qwen3-0.6b --out $M > /tmp/res/synth.txt 2>&1
# linear_rows with WIDE_ROWS row tiles where the grid stays full: its bits at the real shapes
# on the GPU (both row counts), then its time as dispatched (row_tiles_for) against linear_mma
# and torch, then the steps it serves: a c64 mixed step and a b64 decode step
T=600 step rows_test python3 -m pytest -q -p no:cacheprovider tests/kernels_cuda/test_linear_rows.py
step rows_06 python3 tools/device_bench_linear.py --x-bf16 --rows \
  --shapes "0.6B qkv,0.6B o,0.6B gate_up,0.6B down" --ms 64,128,184,256 --prefill ""
step rows_8b python3 tools/device_bench_linear.py --x-bf16 --rows \
  --shapes "8B qkv,8B gate_up,8B o,8B down" --ms 16,32,64 --prefill ""
step mixed python3 tools/device_profile_decode.py $M --batch 56 --context 256 --mixed 128
step b64 python3 tools/device_profile_decode.py $M --batch 64 --context 256
# HTTP c64 with HF in the same call (HF's rate moved 477 -> 1,247 -> 630 tok/s run to run),
# then vtllm alone twice more for its spread
T=900 step http_hf env PY=python3 MODEL=$M VT_ARGS="--device cuda" HF_MODEL=$M \
  HF_ARGS="--device cuda --dtype bfloat16" SKIP_PEER=1 THREADS=16 CONCURRENCY=64 \
  OUT=/tmp/res/http bash loadtest/peers/compare_servers.sh
step http_table python3 loadtest/peers/compare_table.py /tmp/res/http --runs vtllm hf
H="env PY=python3 MODEL=$M SKIP_PEER=1 THREADS=16 CONCURRENCY=64"
for r in a b; do
  T=600 step http_$r $H VT_ARGS="--device cuda" OUT=/tmp/res/http_$r \
    bash loadtest/peers/compare_servers.sh
  step http_${r}_table python3 loadtest/peers/compare_table.py /tmp/res/http_$r --runs vtllm
done
# the GPU gates
T=600 step gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
# bench gpu at the 0.6B shape (c1, b64, TTFT) for the record
T=900 step bench_06 python3 -m vtllm bench gpu --shapes qwen3-0.6b --peers none --steps 32 \
  --prompts 128,1024 --batches 1,64
# Decode attention at serving's shape: Nsight's durations of the ring kernel and its combine
# (the name filter of the last plan matched only the combine: no filter, the first launches)
T=300 step ncu_ring ncu --launch-count 16 --section SpeedOfLight --section LaunchStats \
  --section Occupancy --section WarpStateStats python3 tools/device_bench_attention.py \
  --variant vtllm/kernels/cuda/attention_ring.py --cases 0.6B:64:256 --kv bfloat16
