"""A bf16 DeepSeek-V3 target in Kimi-K2.5's INT4 format, and the same weights dequantized (issue 43).

Kimi-K2.5 ships its routed experts as compressed-tensors W4A16 ``pack-quantized``: int4, symmetric,
one bf16 scale per 32 inputs, eight values an int32 (the lowest 4 bits first, each stored +8);
attention, shared experts, the dense first layer and ``lm_head`` stay bf16 (its ``ignore`` list).
:func:`quantize_target` writes that format from a trained bf16 target so SGLang serves it through its
own INT4 MoE path, and beside it the *dequantized* model (every routed expert as ``q * scale`` in bf16,
no ``quantization_config``): the same numbers computed by another engine's kernels, the role vLLM
played in the failure eaglebox exists for. :func:`decompress_with_compressed_tensors` reads the INT4
files back with the compressed-tensors package itself (SGLang's dependency), so "the file holds these
weights" is checked by the format's own code, not by this module's inverse.

    python -m eaglebox_dev.int4 SRC --out INT4_DIR --dequantized BF16_DIR
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import sys
from pathlib import Path

import torch

BITS = 4
GROUP = 32
PER_WORD = 32 // BITS
QMIN, QMAX = -(1 << (BITS - 1)), (1 << (BITS - 1)) - 1
KIMI_K25_QUANTIZATION = {
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": GROUP,
                    "num_bits": BITS, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                    "symmetric": True, "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
"""``text_config.quantization_config`` of ``moonshotai/Kimi-K2.5`` as published (keys in its order). The
vision entries match nothing in a text-only target and are kept so the block is Kimi's, byte for byte."""
ROUTED_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
"""The tensors Kimi's ``ignore`` list leaves to ``targets: [Linear]``: routed experts' projections."""
SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")
"""What compressed-tensors' ``pack-quantized`` writes for a symmetric group-quantized Linear."""
STAMP = "eaglebox-int4.json"


def quantize(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [out, in] -> (int8 values in [-8, 7], bf16 scales [out, in / group]). The scale is the
    group's largest |w| / 7.5, compressed-tensors' ``minmax`` observer for symmetric int4 (the
    observer Kimi's block names); values are rounded against the stored bf16 scale, so ``q * scale`` is
    the nearest grid point of the scale that serving reads."""
    out, cols = w.shape
    if cols % group:
        raise ValueError(f"{cols} inputs are not a multiple of the group size {group}")
    g = w.float().reshape(out, cols // group, group)
    scale = (g.abs().amax(-1) / ((QMAX - QMIN) / 2)).to(torch.bfloat16)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale).float()
    q = torch.round(g / safe[..., None]).clamp(QMIN, QMAX).to(torch.int8)
    return q.reshape(out, cols), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` per group, rounded once to bf16 (the product is exact in float32)."""
    out, cols = q.shape
    g = q.float().reshape(out, scale.shape[1], -1) * scale.float()[..., None]
    return g.reshape(out, cols).to(torch.bfloat16)


def pack(q: torch.Tensor) -> torch.Tensor:
    """int8 [out, in] -> int32 [out, in / 8]: value ``8k + j`` of a row in bits ``4j..4j+3`` of word ``k``,
    stored as ``q + 8``."""
    out, cols = q.shape
    if cols % PER_WORD:
        raise ValueError(f"{cols} columns do not fill int32 words of {PER_WORD} values")
    u = (q.to(torch.int64) - QMIN).reshape(out, cols // PER_WORD, PER_WORD)
    words = (u << (BITS * torch.arange(PER_WORD))).sum(-1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)  # the same 32 bits, signed


def unpack(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """The inverse of :func:`pack`: int32 [out, cols / 8] -> int8 [out, cols]."""
    w = packed.to(torch.int64) & 0xFFFFFFFF
    u = (w[..., None] >> (BITS * torch.arange(PER_WORD))) & ((1 << BITS) - 1)
    return (u.reshape(packed.shape[0], -1)[:, :cols] + QMIN).to(torch.int8)


def _weight_files(src: Path) -> list[Path]:
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{src}: no *.safetensors files")
    return files


def quantize_target(src: Path, out: Path, dequantized: Path | None = None, log=print) -> dict:
    """Write ``src`` (a bf16 DeepSeek-V3 checkpoint, routed experts as per-expert 2D Linears) to ``out``
    in Kimi-K2.5's INT4 format and, with ``dequantized``, the same weights as bf16; every other file is
    copied. Returns (and stamps into ``out``) what was quantized and the weight error it made."""
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    if "quantization_config" in config:
        raise ValueError(f"{src}/config.json already has a quantization_config: quantize a bf16 target")
    targets = [(out, True)] + ([(Path(dequantized), False)] if dequantized else [])
    tmps = {d: d.with_name(d.name + ".tmp") for d, _ in targets}
    for tmp in tmps.values():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    quantized, err_sq, ref_sq, max_rel = 0, 0.0, 0.0, 0.0
    weight_map: dict[Path, dict[str, str]] = {d: {} for d, _ in targets}
    for f in _weight_files(src):
        packed, plain = {}, {}
        for name, t in load_file(f).items():
            if not ROUTED_EXPERT.match(name):
                packed[name] = plain[name] = t
                continue
            if t.dtype != torch.bfloat16:
                raise ValueError(f"{f}: {name} is {t.dtype}; the quantizer reads a bf16 target")
            q, scale = quantize(t)
            deq = dequantize(q, scale)
            base = name[: -len(".weight")]
            packed |= {f"{base}.weight_packed": pack(q), f"{base}.weight_scale": scale,
                       f"{base}.weight_shape": torch.tensor(t.shape)}  # int64, as compressed-tensors writes it
            plain[name] = deq
            d = (deq.float() - t.float())
            err_sq += float(d.square().sum())
            ref_sq += float(t.float().square().sum())
            max_rel = max(max_rel, float(d.abs().max() / t.float().abs().max().clamp_min(1e-30)))
            quantized += 1
        for d, is_int4 in targets:
            tensors = packed if is_int4 else plain
            save_file({k: v.contiguous() for k, v in tensors.items()}, tmps[d] / f.name, metadata={"format": "pt"})
            weight_map[d] |= dict.fromkeys(tensors, f.name)
    if not quantized:
        raise ValueError(f"{src}: no routed-expert weights ({ROUTED_EXPERT.pattern}); not a DeepSeek-V3 MoE target")
    summary = {"source": str(src), "format": "compressed-tensors pack-quantized W4A16", "group_size": GROUP,
               "symmetric": True, "quantized_tensors": quantized,
               "weight_rel_rms_error": (err_sq / ref_sq) ** 0.5, "weight_max_abs_error_over_max_abs": max_rel}
    for d, is_int4 in targets:
        tmp = tmps[d]
        cfg = copy.deepcopy(config)
        if is_int4:
            cfg["quantization_config"] = copy.deepcopy(KIMI_K25_QUANTIZATION)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if (src / "model.safetensors.index.json").exists():
            index = json.loads((src / "model.safetensors.index.json").read_text())
            index["weight_map"] = weight_map[d]
            index.setdefault("metadata", {})["total_size"] = sum(p.stat().st_size for p in tmp.glob("*.safetensors"))
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        for p in src.iterdir():  # tokenizer, chat template, remote code; not the source's own stamps
            if p.is_file() and p.suffix != ".safetensors" and p.name not in (
                    "config.json", "model.safetensors.index.json") and not p.name.startswith("eaglebox-"):
                shutil.copy(p, tmp / p.name)
        (tmp / STAMP).write_text(json.dumps({**summary, "int4": is_int4}, indent=1) + "\n")
        shutil.rmtree(d, ignore_errors=True)
        tmp.replace(d)
    log(f"int4: {quantized} routed-expert weights -> {out} (weight rel. RMS error "
        f"{summary['weight_rel_rms_error']:.4f})" + (f"; dequantized bf16 -> {dequantized}" if dequantized else ""))
    return summary


def decompress_with_compressed_tensors(model_dir: Path) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Read an INT4 checkpoint with the compressed-tensors package (SGLang's dependency): a skeleton of
    ``nn.Linear`` modules named as the checkpoint's (not the router, ``mlp.gate``: DeepSeek-V3's own
    module in its reference code, a Linear built unquantized in SGLang's), the config's scheme applied by its own target and
    ignore matching, compressed, loaded with the file's tensors, decompressed. Returns the decompressed
    ``{name.weight: tensor}`` and the modules it quantized; raises when a module's tensors are not the
    ones its compressor expects (names, shapes, dtypes)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from safetensors.torch import load_file

    config = json.loads((Path(model_dir) / "config.json").read_text())
    qconfig = QuantizationConfig.model_validate(config["quantization_config"])
    tensors = {k: v for f in _weight_files(Path(model_dir)) for k, v in load_file(f).items()}
    root = torch.nn.Module()
    for name, t in tensors.items():
        base, _, leaf = name.rpartition(".")
        if leaf in ("weight", "weight_packed") and t.dim() == 2 and ".layers." in name and not base.endswith(".mlp.gate"):
            cols = int(tensors[f"{base}.weight_shape"][1]) if leaf == "weight_packed" else t.shape[1]
            rows = t.shape[0]
            _put(root, base, torch.nn.Linear(cols, rows, bias=False, device="meta", dtype=torch.bfloat16))
    apply_quantization_config(root, qconfig)
    ModelCompressor(quantization_config=qconfig).compress_model(root)
    quantized = set()
    for name, module in root.named_modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        quantized.add(name)
        for leaf, param in list(module.named_parameters(recurse=False)):
            got = tensors.get(f"{name}.{leaf}")
            if got is None or got.shape != param.shape or got.dtype not in (param.dtype, torch.bfloat16):
                raise ValueError(f"{model_dir}: {name}.{leaf}: compressed-tensors expects {param.dtype} "
                                 f"{tuple(param.shape)}, the file has "
                                 f"{'nothing' if got is None else f'{got.dtype} {tuple(got.shape)}'}")
            setattr(module, leaf, torch.nn.Parameter(got.clone(), requires_grad=False))
    ModelCompressor(quantization_config=qconfig).decompress_model(root)
    return {f"{n}.weight": root.get_submodule(n).weight.detach() for n in sorted(quantized)}, quantized


def _put(root: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    parent = root
    *heads, leaf = path.split(".")
    for h in heads:
        if not hasattr(parent, h):
            parent.add_module(h, torch.nn.Module())
        parent = getattr(parent, h)
    parent.add_module(leaf, module)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eaglebox_dev.int4", description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="a bf16 DeepSeek-V3 target directory")
    ap.add_argument("--out", type=Path, required=True, help="where the INT4 (compressed-tensors) target goes")
    ap.add_argument("--dequantized", type=Path, help="where the dequantized bf16 copy goes")
    ap.add_argument("--verify", action="store_true",
                    help="decompress --out with compressed-tensors and compare with --dequantized, bit for bit")
    a = ap.parse_args(argv)
    quantize_target(a.src, a.out, a.dequantized)
    if a.verify:
        from safetensors.torch import load_file

        if a.dequantized is None:
            ap.error("--verify needs --dequantized")
        got, modules = decompress_with_compressed_tensors(a.out)
        mine = {k: v for f in _weight_files(a.dequantized) for k, v in load_file(f).items()}
        bad = [k for k, v in got.items() if not torch.equal(v, mine[k])]
        print(f"int4: compressed-tensors decompressed {len(modules)} modules; {len(bad)} differ from --dequantized")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
