"""The MLA draft (SGLang 0.5.23's ``Eagle3DeepseekV2ForCausalLM``) and the EAGLE-3.1 options: the trainer's
forward against SGLang's own class loaded from the export, the TTT attention against a dense absorbed
reference, the export's config, keys and check, the KV bytes a token, and the atomic export."""

import json
import sys

import pytest
import torch

from eaglebox.config import load_config
from eaglebox.draft.export import check_export, export_draft, recover_export, replace_dir
from eaglebox.draft.spec import DraftSpec, draft_spec
from eaglebox.errors import EagleboxError
from eaglebox.train.checkpoint import trainable_state
from eaglebox.train.model import Eagle3Draft
from eaglebox.train.ttt import flex_ttt_attention, ttt_attention, ttt_forward, ttt_steps

MLA = {"q_lora_rank": 32, "kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12}


def spec(arch="deepseek_mla", fc_norm=False, norm_output=False) -> DraftSpec:
    mla = MLA if arch == "deepseek_mla" else {}
    return DraftSpec(hidden_size=64, target_hidden_size=64, num_aux=3, num_attention_heads=4,
                     num_key_value_heads=4 if mla else 2, head_dim=24 if mla else 16, intermediate_size=96,
                     vocab_size=128, draft_vocab_size=64, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                     max_position_embeddings=256, architecture=arch, fc_norm=fc_norm, norm_output=norm_output, **mla)


def random_draft(s: DraftSpec, seed=0) -> Eagle3Draft:
    """Weights away from their init (norms not 1), so every norm and projection shows in the output."""
    torch.manual_seed(seed)
    m = Eagle3Draft(s)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p) / p.shape[-1] ** 0.5)
        m.d2t.copy_(torch.arange(s.draft_vocab_size))  # draft id i -> target id 2i
        m.t2d.zero_()
        m.t2d[torch.arange(s.draft_vocab_size) * 2] = True
    return m


def trainer_logits(m: Eagle3Draft, ids, aux, steps):
    """The trainer's TTT unroll (eager kernels), draft-vocab logits of each step [T, V]."""
    w = m.step_weights(torch.float32)
    with torch.no_grad():
        normed = ttt_steps(m, w, ids, m.project_aux(aux), torch.ones_like(ids, dtype=torch.bool), steps)
    return [(x @ w["lm_head"].T)[0] for x in normed]


@pytest.mark.parametrize(("arch", "fc_norm", "norm_output"), [
    ("deepseek_mla", False, False), ("deepseek_mla", True, True), ("llama", True, True)])
def test_export_computes_in_sglangs_class_what_the_trainer_computes(tmp_path, arch, fc_norm, norm_output):
    """SGLang's class, its loader and absorbed MLA forward (only the paged attention replaced), drafting
    as the server does (extend over 0..t, then chain steps with the drafted hidden state), against the
    trainer's TTT steps at the same positions."""
    from eaglebox.draft.sglang_class import SGLangDraft

    s = spec(arch, fc_norm, norm_output)
    ours = random_draft(s)
    d = export_draft(tmp_path / "draft", s, trainable_state(ours), {"layer_ids": [1, 2, 3]}, torch.float32)
    sg = SGLangDraft(d)
    sg.set_embed(ours.embed_tokens.weight)
    assert type(sg.model).__name__ == {"llama": "LlamaForCausalLMEagle3",
                                       "deepseek_mla": "Eagle3DeepseekV2ForCausalLM"}[arch]
    assert (sg.model.model.fc_norm is not None) == fc_norm and sg.model.model.norm_output == norm_output
    T, steps = 20, 3
    ids, aux = torch.randint(0, 128, (1, T)), torch.randn(1, T, 192)
    want = trainer_logits(ours, ids, aux, steps)
    worst = 0.0
    for t in (3, 10, T - 1 - steps):
        sg.reset()
        logits, h = sg.forward(ids[0, 1 : t + 2], aux[0, : t + 1], torch.arange(t + 1))
        worst = max(worst, (logits[-1] - want[0][t]).abs().max().item())
        for i in range(1, steps):
            logits, h = sg.forward(ids[0, t + 1 + i : t + 2 + i], h[-1:], torch.tensor([t + i]))
            worst = max(worst, (logits[-1] - want[i][t]).abs().max().item())
    scale = max(x.abs().max().item() for x in want)
    print(f"parity {arch} fc_norm={fc_norm} norm_output={norm_output}: max |diff| {worst:.3g} (logits up to {scale:.3g})")
    assert torch.equal(sg.hot_token_id, torch.arange(64) * 2)
    assert worst < 1e-4 * max(1.0, scale)


def absorbed_reference(m: Eagle3Draft, x_steps, T):
    """MLA attention of every TTT step as SGLang serves it, written out token by token: q_nope absorbed
    into the latent (w_kc), scores over the cached latent + RoPE key of the keys the step sees (step 0
    causally, later steps at the query's index), output through w_vc. x_steps: [steps][1, T, 2H]."""
    from eaglebox.train.mla import apply_rotary_interleaved

    a, s = m.midlayer.self_attn, m.spec
    nope, rope, L, vd, h = s.qk_nope_head_dim, s.qk_rope_head_dim, s.kv_lora_rank, s.v_head_dim, s.num_attention_heads
    w = {k: v.detach() for k, v in a.weights().items()}
    w["q_a"], w["kv_a"] = a.q_a_proj.weight.detach(), a.kv_a_proj_with_mqa.weight.detach()
    w_kc, w_vc = w["kv_b"].view(h, nope + vd, L).split([nope, vd], dim=1)  # [h, nope, L], [h, vd, L]

    def norm(x, g):
        return g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.rms_norm_eps)

    lat, qs = [], []
    for i, x in enumerate(x_steps):
        cos, sin = a.rotary(torch.arange(T)[None] + i)
        q = (norm(x[0] @ w["q_a"].T, w["q_a_norm"]) @ w["q_b"].T).view(T, h, nope + rope)
        q_pe = apply_rotary_interleaved(q[None, :, :, nope:].transpose(1, 2), cos, sin)[0].transpose(0, 1)
        c, k_pe = (x[0] @ w["kv_a"].T).split([L, rope], dim=-1)
        k_pe = apply_rotary_interleaved(k_pe[None, None], cos, sin)[0, 0]
        lat.append(torch.cat([norm(c, w["kv_a_norm"]), k_pe], dim=-1))  # [T, L + rope]: what is cached
        qs.append(torch.cat([torch.einsum("thn,hnl->thl", q[..., :nope], w_kc), q_pe], dim=-1))  # [T, h, L + rope]
    out = []
    for i in range(len(x_steps)):
        rows = []
        for t in range(T):
            cache = torch.cat([lat[0][: t + 1]] + [lat[j][t : t + 1] for j in range(1, i + 1)])
            p = (torch.einsum("hd,kd->hk", qs[i][t], cache) / (nope + rope) ** 0.5).softmax(-1)
            rows.append(torch.einsum("hvl,hl->hv", w_vc, p @ cache[:, :L]))  # [h, vd]
        out.append(torch.stack(rows, dim=1)[None])  # [1, h, T, vd]
    return out


def test_mla_ttt_attention_equals_the_absorbed_latent_attention_sglang_serves():
    torch.manual_seed(1)
    m = random_draft(spec())
    T, steps = 9, 3
    xs = [torch.randn(1, T, 128) for _ in range(steps)]
    ref = absorbed_reference(m, xs, T)
    w = m.step_weights(torch.float32)
    keys, values = [], []
    with torch.no_grad():
        for i, x in enumerate(xs):
            q, k, v = m.midlayer.self_attn.qkv(w, x @ torch.cat([w["in_tok"], w["in_hid"]], 1).T, torch.arange(T)[None] + i)
            keys.append(k)
            values.append(v)
            assert q.shape == (1, 4, T, 24) and v.shape == (1, 4, T, 12)
            dense = ttt_attention(q, keys, values, torch.ones(1, T, dtype=torch.bool))
            flex = flex_ttt_attention(q, keys, values, torch.ones(1, T, dtype=torch.bool), steps)  # v narrower than k
            for got in (dense, flex):
                assert torch.allclose(got, ref[i], atol=1e-5), (i, (got - ref[i]).abs().max())


def test_mla_draft_trains_through_ttt():
    """Every MLA weight (and fc_norm) gets a gradient from the TTT loss; a few steps lower it."""
    s = spec(fc_norm=True, norm_output=True)
    m = random_draft(s)
    torch.manual_seed(2)
    T = 24
    batch = {"input_ids": torch.randint(0, 128, (2, T)), "loss_mask": torch.ones(2, T, dtype=torch.bool),
             "valid": torch.ones(2, T, dtype=torch.bool), "aux": torch.randn(2, T, 192), "last": torch.randn(2, T, 64)}
    head = torch.randn(128, 64)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(6):
        loss, _, n = ttt_forward(m, batch, head, 3)
        total = (loss / n.clamp(min=1)).sum()
        opt.zero_grad()
        total.backward()
        if not losses:
            for name, p in m.named_parameters():
                if p.requires_grad:
                    assert p.grad is not None and p.grad.abs().sum() > 0, name
        opt.step()
        losses.append(total.item())
    assert losses[-1] < losses[0], losses


def test_export_writes_the_keys_sglangs_mla_class_reads_and_the_kv_bytes(tmp_path):
    s = spec(fc_norm=True)
    d = export_draft(tmp_path / "draft", s, trainable_state(random_draft(s)), {"layer_ids": [1, 2, 3]})
    cfg = check_export(d)
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert {k: cfg[k] for k in MLA} == MLA and cfg["rope_interleave"] is True and cfg["fc_norm"] is True
    assert "head_dim" not in cfg and "num_key_value_heads" not in cfg  # the MLA class reads neither
    assert cfg["eaglebox"]["draft_kv_cache"] == {"bytes_per_token": (24 + 8) * 2, "dtype": "bfloat16",
                                                 "formula": "(kv_lora_rank + qk_rope_head_dim) * bytes"}
    assert spec("llama").kv_cache_bytes_per_token(2) == 2 * 2 * 16 * 2
    kimi = DraftSpec(**{**spec().to_dict(), "kv_lora_rank": 512, "qk_rope_head_dim": 64})
    assert kimi.kv_cache_bytes_per_token(2) == 1152


def rewrite(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(("change", "message"), [
    ({"q_lora_rank": None}, r"no integer q_lora_rank, which Eagle3DeepseekV2ForCausalLM requires"),
    ({"norm_before_fc": True}, r"config sets \['norm_before_fc'\]"),
    ({"use_aux_norm": True}, r"config sets \['use_aux_norm'\]"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"no rope_scaling"),
    ({"rope_interleave": False}, r"rope_interleave true"),
    ({"kv_lora_rank": 32}, r"kv_a_proj_with_mqa.weight has shape \(32, 128\), config implies \(40, 128\)"),
    ({"fc_norm": True}, r"weights \['fc_norm.0.weight', 'fc_norm.1.weight', 'fc_norm.2.weight'\] differ"),
    ({"architectures": ["DeepseekV3ForCausalLM"]}, r"architectures must be one of"),
])
def test_check_export_refuses_what_the_mla_class_would_read_otherwise(tmp_path, change, message):
    d = export_draft(tmp_path / "draft", spec(), trainable_state(random_draft(spec())), {"layer_ids": [1, 2, 3]})
    rewrite(d, **change)
    with pytest.raises(EagleboxError, match=message):
        check_export(d)


def target(tmp_path, **cfg):
    d = tmp_path / "target"
    d.mkdir(exist_ok=True)
    base = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 6, "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96, "vocab_size": 128,
            "max_position_embeddings": 128, **MLA}
    (d / "config.json").write_text(json.dumps({k: v for k, v in {**base, **cfg}.items() if v is not None}))
    return d


def draft_cfg(tmp_path, *overrides):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  path: x\n")
    return load_config(p, ["train.draft.architecture=deepseek_mla", *overrides]).train.draft


def test_mla_spec_takes_the_targets_widths_or_the_configs_and_names_what_is_missing(tmp_path):
    s = draft_spec(target(tmp_path), draft_cfg(tmp_path), 3)
    assert (s.architecture, s.head_dim, s.num_key_value_heads) == ("deepseek_mla", 24, 4)
    assert {k: getattr(s, k) for k in MLA} == MLA
    s = draft_spec(target(tmp_path), draft_cfg(tmp_path, "train.draft.kv_lora_rank=48", "train.draft.fc_norm=true"), 3)
    assert s.kv_lora_rank == 48 and s.fc_norm and s.kv_cache_bytes_per_token(2) == (48 + 8) * 2
    with pytest.raises(EagleboxError, match=r"^train.draft.q_lora_rank: .* has no q_lora_rank to take; set it"):
        draft_spec(target(tmp_path, q_lora_rank=None), draft_cfg(tmp_path), 3)  # DeepSeek-V2-Lite has none
    with pytest.raises(EagleboxError, match=r"^train.draft.num_key_value_heads: the deepseek_mla draft has no KV"):
        draft_spec(target(tmp_path), draft_cfg(tmp_path, "train.draft.num_key_value_heads=2"), 3)
    yarn = target(tmp_path, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    with pytest.raises(EagleboxError, match=r"config.json: rope_scaling: the deepseek_mla draft is trained with default "
                                            r"RoPE only"):
        draft_spec(yarn, draft_cfg(tmp_path), 3)
    assert draft_spec(yarn, draft_cfg(tmp_path, 'train.draft.rope_scaling={"rope_type": "default"}'), 3).rope_scaling \
        is None


def test_kimi_recipe_trains_the_mla_draft(tmp_path):
    kimi = target(tmp_path, hidden_size=7168, num_attention_heads=64, num_key_value_heads=64, intermediate_size=18432,
                  vocab_size=163840, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                  v_head_dim=128, rope_scaling={"rope_type": "yarn", "factor": 64.0, "mscale": 1.0,
                                                "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096})
    cfg = load_config("configs/kimi-k2.5-8x-rtxpro6000.yaml", [f"model.path={kimi}"])
    s = draft_spec(kimi, cfg.train.draft, 3)
    assert s.architecture == "deepseek_mla" and s.kv_cache_bytes_per_token(2) == 1152 and s.rope_scaling is None


def snapshot(d):
    """Which complete draft ``d`` holds (its provenance tag), or None."""
    try:
        return check_export(d)["eaglebox"]["tag"]
    except EagleboxError:
        return None


class Crash(BaseException):
    pass


def test_export_swaps_atomically_whatever_line_it_dies_on(tmp_path):
    """Run the export once per line of ``export_draft`` and of its swap (``replace_dir``), dying just
    before that line (a trace function raises there, as a kill would stop it): at every point a complete draft, old or new, is at ``out``
    or its ``.old`` sibling, and the next export (or :func:`recover_export`) leaves one at ``out``."""
    s = spec()
    w = trainable_state(random_draft(s))
    out = tmp_path / "draft"
    old_dir = tmp_path / ".draft.old"
    lines = set()
    CODES = (export_draft.__code__, replace_dir.__code__)

    def record(frame, event, arg):
        if frame.f_code in CODES and event == "line":
            lines.add((frame.f_code, frame.f_lineno))
        return record

    export_draft(out, s, w, {"layer_ids": [1, 2, 3], "tag": "old"})
    sys.settrace(record)
    try:
        export_draft(out, s, w, {"layer_ids": [1, 2, 3], "tag": "old"})
    finally:
        sys.settrace(None)
    assert len(lines) > 10
    for line in sorted(lines, key=lambda cl: (cl[0].co_name, cl[1])):
        def crash(frame, event, arg, line=line):
            if event == "line" and (frame.f_code, frame.f_lineno) == line:
                raise Crash(line)
            return crash

        sys.settrace(crash)
        try:
            with pytest.raises(Crash):
                export_draft(out, s, w, {"layer_ids": [1, 2, 3], "tag": "new"})
        finally:
            sys.settrace(None)
        seen = {snapshot(out), snapshot(old_dir)} - {None}
        assert seen, f"no complete draft after dying before line {line}"
        recover_export(out)
        assert snapshot(out) in ("old", "new") and not old_dir.exists(), line
        export_draft(out, s, w, {"layer_ids": [1, 2, 3], "tag": "old"})  # back to the old draft
    assert snapshot(out) == "old"
