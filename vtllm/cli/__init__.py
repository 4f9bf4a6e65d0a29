"""The command line's subcommands; shared set-up lives here."""

import logging
import sys

from vtllm import config


def cli_settings(args) -> tuple[dict, config.EngineConfig]:
    """The knob flags given on the command line, and the resolved config; sets up logging."""
    cli = {k.name: getattr(args, k.name, None) for k in config.KNOBS}
    engine_config, _ = config.resolve(cli)
    logging.basicConfig(
        level=engine_config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # numba's driver logs every allocation and module unload at INFO: traces, not news
    logging.getLogger("numba").setLevel(logging.WARNING)
    return cli, engine_config
