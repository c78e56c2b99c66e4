"""A config error caused by a command-line override names that override, also when the override invents
a section (``foo.bar=1``) or a subsection (``train.nodraft.x=1``): not "missing", not a line of the YAML
file that never held the key. Errors of the file's own keys still name their line."""

from __future__ import annotations

import pytest

from eaglebox.config import ConfigError, load_config

YAML = "model:\n  path: /m\ntrain:\n  lr: 1.0e-4\n  epochs: 2\n"


@pytest.mark.parametrize("override, message", [
    ("foo.bar=1", "override 'foo.bar=1': foo: unknown key"),
    ("train.nodraft.x=1", "override 'train.nodraft.x=1': train.nodraft: unknown key"),
    ("train.draft.nope=1", "override 'train.draft.nope=1': train.draft.nope: unknown key"),
    ("train.epochs=0", "override 'train.epochs=0': train.epochs: Input should be greater than or equal to 1"),
])
def test_an_override_error_names_the_override(tmp_path, override, message):
    p = tmp_path / "c.yaml"
    p.write_text(YAML)
    with pytest.raises(ConfigError) as err:
        load_config(p, [override])
    assert str(err.value) == f"{p}: {message}"


def test_errors_of_the_files_own_keys_still_name_their_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(YAML + "  nope: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(p, ["train.lr=2e-4"])
    assert str(err.value) == f"{p}: line 6: train.nope: unknown key"
