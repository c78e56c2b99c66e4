"""Typed, strict YAML configuration with dotted overrides."""

from eaglebox.config.load import ConfigError, dump_config, load_config
from eaglebox.config.schema import Config

__all__ = ["Config", "ConfigError", "dump_config", "load_config"]
