"""Scheduler settings. Built once by vtllm.config (the only reader of env vars and flags)."""

import msgspec


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True):
    max_num_seqs: int = 64  # requests running at once = number of slots on the device
    max_num_batched_tokens: int = 2048  # tokens computed per step, all chunks together
    max_model_len: int = 4096  # prompt + output tokens of one request
    block_size: int = 16  # tokens per KV-cache block
    num_blocks: int = 1024  # KV-cache blocks, block 0 included (reserved as the null block)
    enable_prefix_caching: bool = True
    # Blocks handed out before cached prefixes are evicted for room (0: no cap; see BlockPool).
    resident_blocks: int = 0
    eos_token_ids: tuple[int, ...] = ()
    # Every layer's sliding window in tokens (the query's own included) when every layer has
    # one: blocks older than every window still to come are freed (scheduler/sliding_window);
    # 0: every block lives as long as its request.
    sliding_window: int = 0
    # n-gram speculation (scheduler/speculative.py): proposals per step, 0 = off
    num_speculative_tokens: int = 0
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 1
    # no drafts in a step while this many requests run (0: no limit; scheduler/speculative.py)
    speculative_disable_by_batch_size: int = 0

    def __post_init__(self):
        # Engine configuration, not user input: a plain ValueError names the field at fault.
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulerConfig.{name} must be >= 1")
        if self.num_speculative_tokens < 0 or not (
            1 <= self.prompt_lookup_min <= self.prompt_lookup_max
        ):
            raise ValueError(
                "SchedulerConfig: num_speculative_tokens >= 0 and "
                "1 <= prompt_lookup_min <= prompt_lookup_max"
            )
        if self.sliding_window < 0:
            raise ValueError("SchedulerConfig.sliding_window must be >= 0")
        if self.num_blocks < 2:
            raise ValueError("SchedulerConfig.num_blocks must be >= 2 (block 0 is the null block)")

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1
