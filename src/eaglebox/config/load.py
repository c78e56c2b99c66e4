"""Load a YAML config, apply dotted overrides, validate, and name the file, line and key on error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from eaglebox.config.schema import Config
from eaglebox.errors import EagleboxError


class ConfigError(EagleboxError, ValueError):
    """A config problem, already phrased for the user (file, line, dotted key)."""


def _line_map(node: yaml.Node, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """Dotted key path -> 1-based line number, read from the YAML node tree; duplicate keys are errors."""
    lines: dict[tuple[str, ...], int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (str(key_node.value),)
            if path in lines:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: duplicate key {'.'.join(path)}")
            lines[path] = key_node.start_mark.line + 1
            lines.update(_line_map(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[prefix + (str(i),)] = item.start_mark.line + 1
            lines.update(_line_map(item, prefix + (str(i),)))
    return lines


def parse_override(text: str) -> tuple[list[str], Any]:
    """``train.lr=5e-5`` -> (["train", "lr"], 5e-05); the value is read as a YAML scalar or list."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: expected dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({err})") from err
    return key.split("."), value


def apply_override(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for depth, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(keys)}: {'.'.join(keys[: depth + 1])} is not a section")
        node = child
    node[keys[-1]] = value


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config ({err.strerror})") from err
    try:
        lines = _line_map(yaml.compose(text) or yaml.MappingNode("", []))
        data = yaml.safe_load(text) or {}
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    overridden: dict[tuple[str, ...], str] = {}
    for text_override in overrides:
        keys, value = parse_override(text_override)
        try:
            apply_override(data, keys, value)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from err
        overridden[tuple(keys)] = text_override
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(path, err, lines, overridden)) from None


def _describe(path: Path, err: ValidationError, lines: dict, overridden: dict[tuple[str, ...], str]) -> str:
    """One line per error, naming where the key came from: the command-line override that set it, set
    something inside it or created it (``foo.bar=1`` invents ``foo``), else the file's line."""
    out = []
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        key = ".".join(loc) or "(top level)"
        where = next((f"override {text!r}" for o, text in overridden.items()
                      if loc and (loc[: len(o)] == o or o[: len(loc)] == loc)), None)
        if where is None:
            line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), None)
            where = f"line {line}" if line else "missing"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "missing":
            msg = "required key is missing"
        out.append(f"{path}: {where}: {key}: {msg}")
    return "\n".join(out)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
