# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
[ -d $M ] || python3 -m vtllm synth --shape qwen3-0.6b --out $M > /tmp/res/synth.txt 2>&1
# the GPU gates at this commit (the engine tests passed with the timing counters; the rest of
# tests/gpu, and serve's gc.freeze, have not run on a card since)
T=600 step gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
# Decode attention at serving's shapes: Nsight found the ring kernel latency-bound at 3 blocks
# an SM (160 registers and its rings' shared memory) and its 1,024 blocks 2.6 waves, the last
# one partial. Grid sizes that fill whole waves (396 blocks a wave on 132 SMs), bf16 KV:
T=300 step ring_targets python3 tools/device_bench_attention.py --kv bfloat16 \
  --variant vtllm/kernels/cuda/attention_ring.py --targets 396,528,792,1188 \
  --cases 0.6B:64:256,0.6B:56:512,8B:32:1024,8B:64:1024
# HTTP c64 beside HF, then alternated with .device/base, a copy of the tree before gc.freeze
# (made here first: rm -rf .device/base && mkdir -p .device/base && git archive d1c5653 | tar
# -x -C .device/base; compare_servers.sh cds into its tree, whose vtllm `python -m` imports):
# the full collections' pauses should show in p99 ITL and the event loop's CPU a step
H="env PY=python3 MODEL=$M SKIP_PEER=1 THREADS=16 CONCURRENCY=64 VT_ARGS=--device=cuda"
T=900 step http_hf $H HF_MODEL=$M HF_ARGS="--device cuda --dtype bfloat16" OUT=/tmp/res/http \
  bash loadtest/peers/compare_servers.sh
step http_table python3 loadtest/peers/compare_table.py /tmp/res/http --runs vtllm hf
for r in new_a base_a new_b base_b; do
  case $r in base*) tree=.device/base ;; *) tree=. ;; esac
  [ -d $tree/vtllm ] || continue
  T=600 step http_$r $H OUT=/tmp/res/http_$r bash $tree/loadtest/peers/compare_servers.sh
  step http_${r}_table python3 loadtest/peers/compare_table.py /tmp/res/http_$r --runs vtllm
done
