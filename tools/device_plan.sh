# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
# 1. attention_flash's HF teacher-forced case (not yet run on a card: `-k flash` missed it
#    before its parametrize ids named it), then the whole GPU gates at this commit.
T=600 step flash_gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -k flash
T=600 step gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
# 2. TTFT 128 with and without flash prefill (the 128-token prompt fits the decode kernels'
#    rows, so it should not move), and HTTP c64 beside HF with the exact default.
B="python3 -m vtllm bench gpu --peers none --batches 1 --steps 16 --shapes qwen3-0.6b"
T=600 step ttft_06_flash $B --prompts 128,1024 --flash-prefill
T=600 step ttft_06_exact $B --prompts 128,1024
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
T=900 step http_hf env PY=python3 MODEL=$M SKIP_PEER=1 THREADS=16 CONCURRENCY=64 \
  VT_ARGS=--device=cuda HF_MODEL=$M HF_ARGS="--device cuda --dtype bfloat16" \
  OUT=/tmp/res/http bash loadtest/peers/compare_servers.sh
step http_table python3 loadtest/peers/compare_table.py /tmp/res/http --runs vtllm hf
