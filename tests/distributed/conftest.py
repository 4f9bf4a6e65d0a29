"""One local Ray cluster of CPU workers per test module (ray.init takes seconds). Without the
`ray` extra these tests skip: `make test-distributed` installs it and runs them."""

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the ray extra: make test-distributed runs these")
    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """The tiny qwen3 of tests/engine/test_tp.py: fast to load and to step."""
    from vtllm.models.loader import load_model
    from vtllm.models.synthetic import write_checkpoint

    path = write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny-qwen3", seed=5, peaked=True)
    return load_model(path)
