"""The command line's subcommands; shared set-up lives here."""

import logging
import sys

from vtllm import config
from vtllm.errors import InvalidParameter


def cli_settings(args) -> tuple[dict, config.EngineConfig]:
    """The knob flags given on the command line, and the resolved config; sets up logging."""
    cli = {k.name: getattr(args, k.name, None) for k in config.KNOBS}
    positional = getattr(args, "positional_model", None)
    if positional is not None:  # `vtllm serve MODEL`, as vLLM's CLI takes it
        if cli["model"] is not None and cli["model"] != positional:
            raise InvalidParameter(
                f"two models given: {positional} and --model {cli['model']}; give one",
                param="model",
            )
        cli["model"] = positional
    engine_config, _ = config.resolve(cli)
    logging.basicConfig(
        level=engine_config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # numba's driver logs every allocation and module unload at INFO: traces, not news
    logging.getLogger("numba").setLevel(logging.WARNING)
    return cli, engine_config
