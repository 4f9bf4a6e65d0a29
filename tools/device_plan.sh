# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
# Tensor-core prefill attention (attention_flash): its kernel tests on the card, the kernel
# against the prefill kernel and torch's SDPA, its GPU tests, then TTFT with it and without.
T=300 step flash_kernel_tests python3 -m pytest -q -p no:cacheprovider -m cudasim \
  tests/kernels_cuda/test_attention_flash.py
T=300 step flash_bench python3 tools/device_bench_attention.py --kv bfloat16 \
  --prefill 128,1024,2048,4096 --shapes 0.6B,8B --variant vtllm/kernels/cuda/attention_flash.py
T=600 step flash_gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -k flash
B="python3 -m vtllm bench gpu --shapes qwen3-0.6b --peers none --prompts 128,1024,4096 --batches 1"
T=600 step ttft_flash $B --flash-prefill
T=600 step ttft_exact $B
