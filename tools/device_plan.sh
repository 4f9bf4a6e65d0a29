# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
# Tensor-core prefill attention (attention_flash, VT_CUDA_FLASH_PREFILL): its kernel tests on
# the card, the kernel against the prefill kernel and torch's SDPA, its GPU tests, then TTFT
# and HTTP c64 with it and without, then the 8B shape's TTFT and the whole GPU gates.
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
T=300 step flash_kernel_tests python3 -m pytest -q -p no:cacheprovider -m cudasim \
  tests/kernels_cuda/test_attention_flash.py
T=300 step flash_bench python3 tools/device_bench_attention.py --kv bfloat16 \
  --prefill 1024,4096 --shapes 0.6B,8B --variant vtllm/kernels/cuda/attention_flash.py
T=600 step flash_gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -k flash
B="python3 -m vtllm bench gpu --peers none --batches 1 --steps 16"
T=600 step ttft_06_flash $B --shapes qwen3-0.6b --prompts 1024,4096 --flash-prefill
T=600 step ttft_06_exact $B --shapes qwen3-0.6b --prompts 1024,4096
H="env PY=python3 MODEL=$M SKIP_PEER=1 THREADS=16 CONCURRENCY=64"
for r in flash exact flash64; do
  a="--device=cuda"
  case $r in
    flash) a="$a --cuda-flash-prefill=true" ;;
    flash64) a="$a --cuda-flash-prefill=true --cuda-split-attention-rows=64" ;;  # decodes only
  esac
  T=600 step http_$r $H VT_ARGS="$a" OUT=/tmp/res/http_$r bash loadtest/peers/compare_servers.sh
  step http_${r}_table python3 loadtest/peers/compare_table.py /tmp/res/http_$r --runs vtllm
done
T=600 step ttft_8b_flash $B --shapes llama3-8b --prompts 1024 --flash-prefill
T=600 step ttft_8b_exact $B --shapes llama3-8b --prompts 1024
T=600 step gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
