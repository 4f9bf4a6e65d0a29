"""The engine's seam: one Delta type from the scheduler to the reader, merged while the reader
lags (one slot per choice, never a queue), and submit's all-or-nothing."""

import anyio
import pytest

from vtllm.config import resolve
from vtllm.engine.engine import Engine
from vtllm.errors import ContextLengthExceeded
from vtllm.models.synthetic import write_checkpoint
from vtllm.scheduler.output import LENGTH, Delta
from vtllm.scheduler.plan import TokenLogprobs
from vtllm.scheduler.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp("seam"), "tiny", seed=5)
    config, _ = resolve(model=str(path), max_model_len=64, kv_cache_memory=1 << 20, block_size=4)
    engine = Engine.build(config)
    yield engine
    engine.backend.close()


def test_merge_appends_what_grows_and_keeps_the_later_state():
    lp = TokenLogprobs(7, -0.5, 1, [7], [-0.5])
    first = Delta(request_id="r", token_ids=[7], text="a", logprobs=[lp], num_prompt_tokens=3)
    first.merge(
        Delta(
            request_id="r",
            token_ids=[8],
            text="b",
            logprobs=[lp],
            finished=True,
            finish_reason=LENGTH,
            num_output_tokens=2,
        )
    )
    assert (first.token_ids, first.text, len(first.logprobs)) == ([7, 8], "ab", 2)
    assert (first.finished, first.finish_reason, first.num_output_tokens) == (True, LENGTH, 2)
    assert first.num_prompt_tokens == 3  # 0 in the later delta: not known then, kept


def test_a_reader_that_lags_gets_one_merged_delta_per_choice(engine):
    params = SamplingParams(n=2, max_tokens=8, ignore_eos=True, seed=1, logprobs=1)

    async def main():
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            stream = engine.submit([[5, 6, 7]], params, prefix="lag")
            while engine.num_unfinished:  # every token is out before the first read
                await anyio.sleep(0.01)
            read = [(choice.index, delta) async for choice, delta in stream]
            engine.stop()
        return stream, read

    stream, read = anyio.run(main)
    assert sorted(index for index, _ in read) == [0, 1]
    for index, delta in read:
        total = stream.choices[index].total
        assert len(delta.token_ids) == 8 and delta.finished and delta.finish_reason == LENGTH
        assert total.token_ids == delta.token_ids and total.text == delta.text
        assert [lp.token_id for lp in delta.logprobs] == delta.token_ids
    assert engine.scheduler.num_used_blocks == 0


def test_submit_queues_every_choice_or_none(engine):
    async def main():
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            try:
                with pytest.raises(ContextLengthExceeded):
                    engine.submit([[5, 6], list(range(3, 70))], SamplingParams(n=2, max_tokens=4))
                assert engine.num_unfinished == 0  # the first prompt's choices were aborted
            finally:
                engine.stop()

    anyio.run(main)
    assert engine.scheduler.num_used_blocks == 0 and not engine.scheduler.requests
