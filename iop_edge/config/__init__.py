"""The configuration core (pure): schema, load, validation, refresh classification, node payload.

Nothing in this package reads files, the clock or the network: callers hand it text.
"""

from iop_edge.config.load import dump_config, load_config, parse_config
from iop_edge.config.schema import EdgeConfig
from iop_edge.errors import ConfigError, ConfigProblem

__all__ = [
    "ConfigError",
    "ConfigProblem",
    "EdgeConfig",
    "dump_config",
    "load_config",
    "parse_config",
]
