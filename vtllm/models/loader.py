"""One entry point for every checkpoint kind: a GGUF file or an HF safetensors directory."""

from dataclasses import dataclass
from pathlib import Path

from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.models import bert, gguf_loader, safetensors_loader, tokenizer
from vtllm.models.config import ModelConfig
from vtllm.models.default_model import NAME as DEFAULT_NAME
from vtllm.models.default_model import default_model_path
from vtllm.models.tokenizer import Tokenizer
from vtllm.models.weights import ModelWeights


@dataclass(slots=True)
class LoadedModel:
    name: str
    path: Path
    config: ModelConfig
    weights: ModelWeights
    tokenizer: Tokenizer


def load_model(model: str | Path | None = None, *, fp8_rows: bool = False) -> LoadedModel:
    """fp8_rows: FP8 safetensors matrices with row scales stay FP8 (for the CUDA device;
    safetensors_loader.load_weights)."""
    if model is None:
        path, name = default_model_path(), DEFAULT_NAME
    else:
        path = Path(model).expanduser()
        name = path.stem if path.is_file() else path.name
    if path.is_dir():
        if bert.is_encoder(path):
            raise UnsupportedModel(
                f"{path} is an embedding (encoder) model: serve it with --embedding-model "
                "beside a chat model (LLM(embedding_model=...) offline)"
            )
        config = safetensors_loader.read_config(path)
        weights = safetensors_loader.load_weights(path, config, fp8_rows=fp8_rows)
        tok = tokenizer.from_tokenizer_json(path)
    elif path.is_file():
        with path.open("rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelLoadError(f"{path}: not a GGUF file (and not a model directory)")
        reader = gguf_loader.open_gguf(path)
        config, fam = gguf_loader.read_config(reader, path)
        weights = gguf_loader.load_weights(reader, config, fam, path)
        tok = tokenizer.from_gguf(reader, path, gguf_loader.field)
        reader.release_pages()
    else:
        raise ModelLoadError(f"model not found: {path}")
    if not config.eos_token_ids and tok.eos_token_ids:
        config = _with_eos(config, tok.eos_token_ids)
    return LoadedModel(name, path, config, weights, tok)


def _with_eos(config: ModelConfig, eos_ids) -> ModelConfig:
    import msgspec

    return msgspec.structs.replace(config, eos_token_ids=tuple(eos_ids))
