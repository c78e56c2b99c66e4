"""Engine options passed through ``engine.extra_args`` are read by SGLang 0.5.23's own argument parser
and recorded in the capture spec, so provenance sees them (a draft captured with another prefill
attention backend is refused at serving); options eaglebox sets from its own keys, abbreviated or not,
and flags SGLang does not know are refused in one line."""

from __future__ import annotations

import pytest

from conftest import TINY_CONFIG, config_for_model
from eaglebox.cli import check_config
from eaglebox.errors import EagleboxError
from eaglebox.serve.provenance import differences
from eaglebox.shards.contract import CaptureSpec
from eaglebox.shards.spec import capture_spec


def spec_with(tmp_path, model, *extra: str) -> CaptureSpec:
    args = "[" + ", ".join(f'"{a}"' for a in extra) + "]"
    return capture_spec(config_for_model(tmp_path, model, "capture.layer_ids=[0, 1, 2]", f"engine.extra_args={args}"))


def test_hidden_state_flags_in_extra_args_are_recorded_and_compared_at_serving(tiny_target, tmp_path):
    plain = spec_with(tmp_path, tiny_target)
    assert "extra_args" not in plain.as_json()["engine_options"]
    captured = spec_with(tmp_path, tiny_target, "--prefill-attention-backend", "triton", "--pp-size", "2",
                         "--moe-a2a-back=deepep")  # abbreviated, as SGLang's own parser accepts
    assert captured.engine_options.extra_args == {"moe_a2a_backend": "deepep", "pp_size": 2,
                                                        "prefill_attention_backend": "triton"}
    # a draft trained on that capture, served without the flags (and the other way round): named, flag by flag
    assert differences(captured.provenance(), plain, []) == [
        "engine option extra_args.moe_a2a_backend: draft 'deepep' vs serving None",
        "engine option extra_args.pp_size: draft 2 vs serving None",
        "engine option extra_args.prefill_attention_backend: draft 'triton' vs serving None"]
    assert differences(plain.provenance(), captured, [])[0] == ("engine option extra_args.moe_a2a_backend: "
                                                                "draft None vs serving 'deepep'")
    assert len(differences(captured.provenance(), plain, ["extra_args.pp_size"])) == 2  # allowed one by one


@pytest.mark.parametrize("extra, why", [
    (("--attention-back", "triton"), "sets SGLang's attention_backend, which eaglebox sets from engine.attention_backend"),
    (("--speculative-num-steps", "5"), "sets SGLang's speculative_num_steps, which eaglebox sets from serve.*"),
    (("--port", "1234"), "sets SGLang's port, which eaglebox sets from engine.port"),
    (("--no-such-flag",), "SGLang 0.5.23 refuses them: unrecognized arguments: --no-such-flag"),
    (("--prefill-attention-backend", "nonsense"), "SGLang 0.5.23 refuses them: argument --prefill-attention-backend"),
])
def test_flags_eaglebox_owns_or_sglang_does_not_know_are_refused_in_one_line(tiny_target, tmp_path, extra, why):
    with pytest.raises(EagleboxError, match=f"^{TINY_CONFIG}: engine.extra_args: .*{why}"):
        args = "[" + ", ".join(f'"{a}"' for a in extra) + "]"
        check_config(config_for_model(tmp_path, tiny_target, "capture.layer_ids=[0, 1, 2]", "engine.device=cpu",
                                      "engine.max_total_tokens=1024", f"engine.extra_args={args}"), TINY_CONFIG)
