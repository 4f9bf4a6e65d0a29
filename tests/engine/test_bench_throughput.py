"""`bench throughput` builds an engine per depth: each keeps every setting it was given."""

from vtllm import LLM
from vtllm.cli import throughput
from vtllm.models.synthetic import write_checkpoint


def test_bench_engines_keep_the_given_settings(tmp_path, monkeypatch):
    path = write_checkpoint(tmp_path / "m", "tiny", seed=2)
    llm = LLM(
        str(path),
        max_model_len=64,
        kv_cache_memory=1 << 20,
        block_size=4,
        kv_cache_dtype="float32",
        async_depth=1,
    )
    built = []

    class Recorded(LLM):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            built.append(self.config)

    monkeypatch.setattr(throughput, "LLM", Recorded)
    report = throughput.bench_throughput(
        llm, num_prompts=3, input_len=5, output_len=2, concurrency=[2]
    )
    assert [c.async_depth for c in built] == [1, 2]
    for config in built:
        assert (config.max_num_seqs, config.enable_prefix_caching) == (2, False)
        assert (config.max_model_len, config.block_size) == (64, 4)
        assert (config.kv_cache_memory, config.kv_cache_dtype) == (1 << 20, "float32")
        assert (config.model, config.device) == (llm.config.model, llm.config.device)
    assert report["concurrency_2"]["depth2"]["output_tok_s"] > 0
