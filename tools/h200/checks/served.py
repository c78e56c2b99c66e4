"""H100/H200, issue 39: a target of Llama-3.1-8B's decode cost with long, learnable answers, made clearly
faster by an eaglebox draft, measured by ``eaglebox bench`` on real SGLang 0.5.23.

Stages, each skipped when its output exists (a run cut short continues where it stopped):

1. **target**: a 4-layer Llama of Llama-3.1-8B's width trained on code continuations of CPython's
   standard library (``eaglebox_dev.code_corpus``, built where the repo is and carried: corpus, byte-level
   BPE tokenizer, held-out files), then :func:`pad_target` places its 4 layers at 0, 8, 16, 24 of a
   32-layer model whose other 28 layers have random q/k/v/gate/up and zero o_proj/down_proj: they add
   exactly 0 to the residual at the full weight-read cost of Llama-3.1-8B's decode.
2. ``eaglebox extract`` (answers regenerated greedily by the target: the bench decodes greedily),
   ``eaglebox train``.
3. ``eaglebox bench``: target alone, trained draft and the random-weights control, alternating rounds at
   each concurrency, outputs diffed against the target's, then the other chain settings.
4. **decode reference**: the target's decode ms/token next to a random-weights Llama-3.1-8B-shaped
   model's (``--load-format dummy``), both served plain, alternating rounds.
5. ``--online-only`` (issue 31): after extraction, trainer tokens/s offline vs ``train.data=online`` with
   a capture server on the same GPU, alternating rounds, and the server capturing alone (docs/served-gpu.md).
6. ``--online-train N`` (issue 39): instead of extraction, the draft trains with ``train.data=online`` over
   the first N of the stdlib's train rows and windows of the machine's installed packages (built here, on the
   CPU while the target trains: they would not fit the carry), so its data is not bounded by the disk.

Every mode regenerates its answers first with the 4-layer model on a plain server of its own
(:func:`stage_regenerate`); ``eaglebox extract`` and ``eaglebox train`` then find them all cached.

A device call is at most 10 minutes and the machine goes back 30 s after one, so the stages run in a
worker in its own session (it outlives the call); each call (``served.py --follow-s S``) starts the worker
if none runs and copies its results to $OUT every few seconds until it ends or S seconds pass. Results:
``served.json``, ``served.log``, ``bench.json``, ``logs.tar.gz`` (logs, corpus.json, metrics, evals).

    bash tools/h200/run.sh served --follow-s 570
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import follow, log_line, save_json, save_target  # noqa: E402

from eaglebox_dev.checkpoint_files import read_state, write_shards  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(os.environ.get("OUT", "/tmp/out"))
CARRY = ROOT / ".cache" / "h200" / "carry"
CORPUS = CARRY / "code"  # eaglebox_dev.code_corpus's output: train.jsonl.xz, heldout.jsonl, tokenizer/
WORK = Path("/tmp/h200-served")
CONFIG = ROOT / "configs" / "h200-served.yaml"
WIDE = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128}
DEVICE = "cuda"  # --smoke: "cpu", and a tiny WIDE (the flow on a machine without a GPU)
PLACEMENT = (0, 8, 16, 24)
REGENERATE = ("engine.max_total_tokens=400000", "extract.concurrency=512")
"""The regeneration server's KV pool and requests at once: the 4-layer model's KV is 16 KiB a token (1/8 of
the target's), so 512 answers of ~550 tokens at once take ~4.5 GB; it runs alone on the GPU."""
ONLINE_ENGINE = ("engine.max_total_tokens=100000",)
"""The capture server beside an online trainer: ~12 GB of KV, room for the loader's samples in flight."""
LAYERS = 32
START = time.monotonic()
RESULT: dict = {}


def log(msg: str) -> None:
    log_line(WORK / "served.log", msg, START)


def save() -> None:
    save_json(WORK / "served.json", RESULT)


def cfg_now(*overrides: str):
    from eaglebox.config import load_config

    return load_config(CONFIG, list(overrides))


# ---------------------------------------------------------------- target

def train_rows() -> list[str]:
    return lzma.decompress((CORPUS / "train.jsonl.xz").read_bytes()).decode().splitlines()


def target_config(tok, layers: int, **extra):
    """The target's Llama config at ``layers`` layers: Llama-3.1-8B's width, the corpus tokenizer's vocabulary."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tok), num_hidden_layers=layers, max_position_embeddings=4096, rms_norm_eps=1e-5,
                       rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **WIDE, **extra)


def make_shallow(path: Path, steps: int, seq_len: int, batch: int) -> Path:
    """The 4-layer wide target: the corpus's tokenizer, Llama-3.1-8B's width, LM training (bf16 autocast)
    on windows that start at a conversation's first token, over the corpus's train rows (extraction's
    prompts come from the same files; the bench's from held-out files)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from eaglebox_dev.tiny import answer_stream, train_lm

    if (path / "config.json").exists():
        return path
    tok = AutoTokenizer.from_pretrained(CORPUS / "tokenizer")
    t0 = time.monotonic()
    convs = [json.loads(r)["messages"] for r in train_rows()]
    ids, _, starts = answer_stream(tok, convs)
    log(f"target: {len(ids):,} tokens of {len(convs)} conversations tokenized in {time.monotonic() - t0:.0f} s")
    config = target_config(tok, len(PLACEMENT))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(DEVICE)
    t0 = time.monotonic()
    recipe = {"steps": steps, "seq_len": seq_len, "batch_size": batch, "lr": 6e-4, "seed": 0}
    loss = train_lm(model, ids, recipe, starts=starts, device=DEVICE, log=log)
    RESULT["target_training"] = {**recipe, "conversations": len(convs), "tokens": len(ids), "final_loss": round(loss, 4),
                                 "tokens_seen": steps * seq_len * batch, "s": round(time.monotonic() - t0, 1)}
    log(f"target: {steps} steps in {time.monotonic() - t0:.0f} s, final loss {loss:.3f}")
    save_target(model, path, sorted((CORPUS / "tokenizer").iterdir()))
    del model
    return path


def layer_keys(i: int) -> dict[str, str]:
    p = f"model.layers.{i}."
    return {k: p + k + ".weight" for k in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")}


def pad_target(shallow: Path, out: Path, layers: int = LAYERS, placement=PLACEMENT, seed: int = 0) -> Path:
    """``shallow``'s layers at ``placement`` of a ``layers``-layer copy; every other layer has random
    q/k/v/gate/up (initializer_range) and zero o_proj/down_proj, so it adds exactly 0 to the residual."""
    src = read_state(shallow)
    cfg = json.loads((shallow / "config.json").read_text())
    if len(placement) != cfg["num_hidden_layers"]:
        raise ValueError(f"{cfg['num_hidden_layers']} trained layers, {len(placement)} places")
    std = cfg.get("initializer_range", 0.02)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def tensors():
        yield from ((k, src[k]) for k in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"))
        for i in range(layers):
            keys = layer_keys(i)
            if i in placement:
                yield from ((keys[name], src[k]) for name, k in layer_keys(placement.index(i)).items())
                continue
            for name, k in layer_keys(0).items():
                like = src[k]
                if name.endswith("layernorm"):
                    t = torch.ones_like(like)
                elif name in ("self_attn.o_proj", "mlp.down_proj"):
                    t = torch.zeros_like(like)
                else:
                    t = (torch.randn(like.shape, generator=gen, device=DEVICE) * std).to(like.dtype).cpu()
                yield keys[name], t

    write_shards(tmp, tensors())
    cfg["num_hidden_layers"] = layers
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in shallow.iterdir():
        if f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, tmp / f.name)
    (tmp / "eaglebox-padded.json").write_text(json.dumps({
        "trained_layers_at": list(placement), "layers": layers,
        "pass_through": f"o_proj and down_proj zero; q/k/v/gate/up random (std {std}); norms 1"}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def check_pass_through(shallow: Path, target: Path) -> None:
    """The padded target's logits against the shallow one's (HF, bf16, on the GPU): pass-through is exact."""
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[5, 17, 301, 44, 1020, 7, 99, 3]], device=DEVICE)
    outs = []
    for p in (shallow, target):
        m = AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16).to(DEVICE).eval()
        with torch.no_grad():
            outs.append(m(ids).logits.float())
        del m
    torch.cuda.empty_cache()  # the worker's cached blocks would stay out of the servers' reach
    RESULT["pass_through_max_abs_logit_diff"] = float((outs[0] - outs[1]).abs().max())
    log(f"target: padded vs shallow logits, max abs diff {RESULT['pass_through_max_abs_logit_diff']}")


def stage_target(a) -> None:
    target = Path(cfg_now().model.path)
    if (target / "config.json").exists():
        return
    t0 = time.monotonic()
    shallow = make_shallow(WORK / "shallow", a.target_steps, a.target_seq_len, a.target_batch)
    pad_target(shallow, target)
    RESULT["target"] = {"made": f"4 trained layers at {list(PLACEMENT)} of {LAYERS}; the rest pass-through",
                        "bytes": sum(f.stat().st_size for f in target.glob("*.safetensors")),
                        "s": round(time.monotonic() - t0, 1)}
    log(f"target: padded to {LAYERS} layers -> {target}")
    check_pass_through(shallow, target)
    save()


def write_data() -> None:
    """The extraction prompts (the corpus's train rows) and the held-out bench prompts (other files),
    where the config names them."""
    cfg = cfg_now()
    train, heldout = Path(cfg.extract.dataset), Path(cfg.bench.prompts)
    for path, text in ((train, lambda: "\n".join(train_rows()) + "\n"),
                       (heldout, lambda: (CORPUS / "heldout.jsonl").read_text())):
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text())


# ---------------------------------------------------------------- online training over more data (issue 39)

def site_dir() -> Path:
    return WORK / "data" / "site"


def start_site_build(rows: int) -> subprocess.Popen | None:
    """``code_corpus --site-of``: up to ``rows`` windows of this machine's installed packages, in a process
    of its own (on the CPU, while the target trains on the GPU); None when a resumed worker has them."""
    if (site_dir() / "site-manifest.json").exists():
        return None
    cmd = [sys.executable, "-m", "eaglebox_dev.code_corpus", "--out", str(site_dir()), "--site-of", str(CORPUS),
           "--max-rows", str(rows)]
    log("run: " + " ".join(cmd[1:]))
    return subprocess.Popen(cmd, cwd=ROOT, stdout=open(WORK / "logs" / "site-corpus.log", "ab"), stderr=subprocess.STDOUT)


def online_dataset(proc: subprocess.Popen | None, n: int) -> list[str]:
    """The online run's data overrides: ``extract.dataset``, the stdlib's train rows and the installed
    packages' windows shuffled together, of which ``extract.max_samples`` takes the first ``n``."""
    if proc is not None and proc.wait():
        raise RuntimeError(f"the installed packages' corpus failed (exit {proc.returncode}); see logs/site-corpus.log")
    m = json.loads((site_dir() / "site-manifest.json").read_text())
    RESULT["site_corpus"] = {k: m[k] for k in ("roots", "files", "site", "seconds")}
    path = Path(cfg_now().extract.dataset).with_name("train-online.jsonl")
    if not path.exists():
        rows = train_rows() + (site_dir() / "site.jsonl").read_text().splitlines()
        if len(rows) < n:
            raise RuntimeError(f"--online-train {n}: the stdlib's train rows and the installed packages' windows "
                               f"are {len(rows)}")
        random.Random(0).shuffle(rows)
        path.write_text("\n".join(rows) + "\n")
    log(f"online: {m['site']['rows']:,} windows of {m['files']['taken']} installed files in {m['seconds']:.0f} s; "
        f"training on the first {n:,} rows of {path}")
    save()
    return [f"extract.dataset={path}", f"extract.max_samples={n}"]


def online_train_overrides(data: list[str], mem_fraction: float) -> list[str]:
    """``eaglebox train`` with ``train.data=online``: its own capture server takes ``mem_fraction`` of the GPU
    (the trainer the rest). Nothing is stored but the samples in flight, so their room is checked against the
    free disk here, in one error."""
    from eaglebox.extract.online import in_flight, in_flight_reserve
    from eaglebox.shards.spec import capture_spec

    spool = WORK / "online-spool"
    overrides = [*data, "train.data=online", f"train.online.spool_dir={spool}",
                 f"engine.mem_fraction_static={mem_fraction}", *ONLINE_ENGINE]
    cfg = cfg_now(*overrides)
    flying = in_flight(cfg)
    need = in_flight_reserve(cfg.extract.max_length, capture_spec(cfg), flying)
    free = shutil.disk_usage(WORK).free
    RESULT["online_train"] = {"samples": cfg.extract.max_samples, "in_flight_samples": flying,
                              "spool_bytes_max": need, "free_gb": round(free / 1e9, 1), "overrides": overrides}
    if need > free:
        raise RuntimeError(f"online: the spool needs {need / 1e9:.1f} GB for {flying} samples in flight, "
                           f"{free / 1e9:.1f} GB are free")
    log(f"online: {flying} samples in flight at most, {need / 1e9:.1f} GB of spool ({free / 1e9:.1f} GB free)")
    save()
    return overrides


# ---------------------------------------------------------------- extract, train, bench

def eaglebox(verb: str, *overrides: str, log_name: str | None = None) -> int:
    cmd = [sys.executable, "-m", "eaglebox.cli", verb, "--config", str(CONFIG), *overrides]
    log("run: eaglebox " + " ".join(cmd[3:]))
    t0 = time.monotonic()
    with open(WORK / "logs" / f"{log_name or verb}.log", "ab") as logf:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT).returncode
    RESULT.setdefault("stages", []).append({"verb": verb, "overrides": list(overrides), "rc": rc,
                                            "s": round(time.monotonic() - t0, 1)})
    log(f"{verb}: exit {rc} in {time.monotonic() - t0:.0f} s")
    save()
    return rc


def fit_samples(cfg, tokens_a_sample: int = 560, keep_free: float = 0.05) -> str:
    """``extract.max_samples``, lowered to what the device's free disk holds (features of 4 x hidden bf16
    a token; ~150 prompt + the regenerated answer's tokens a sample) once the trainer's checkpoints and drafts
    (``checkpoint.run_bytes``) have their room, keeping ``keep_free`` of it free. Without that room the
    trainer died writing its last checkpoint on the H100 (2026-12-08: 2,000 samples left ~7 GB)."""
    from eaglebox.draft.spec import draft_spec
    from eaglebox.train.checkpoint import run_bytes
    from eaglebox.train.model import Eagle3Draft

    free = shutil.disk_usage(Path(cfg.extract.output_dir).parent).free
    with torch.device("meta"):
        draft = Eagle3Draft(draft_spec(cfg.model.path, cfg.train.draft, num_aux=3))
    room, _ = run_bytes(draft, cfg.train.keep_checkpoints)
    fits = max(0, int((free * (1 - keep_free) - room) / (tokens_a_sample * (4 * WIDE["hidden_size"] * 2 + 9))))
    n = min(cfg.extract.max_samples, fits)
    RESULT["disk"] = {"free_gb": round(free / 1e9, 1), "train_room_gb": round(room / 1e9, 1), "samples_fit": fits,
                      "max_samples": n}
    log(f"extract: {free / 1e9:.1f} GB free, {room / 1e9:.1f} GB of it for training: {fits} samples fit, "
        f"extracting {n}")
    return f"extract.max_samples={n}"


def stage_regenerate(*overrides: str) -> None:
    """The prompts' answers (``cfg``'s extract rows), regenerated greedily by the 4-layer model that the
    target pads, on a plain server of its own: its logits are the target's (:func:`check_pass_through`: the
    pass-through layers add exactly 0), at 1/8 of the decode cost and KV, and greedy decoding is what
    regeneration asks. The answers go to the cache ``eaglebox extract`` and ``eaglebox train`` read
    (``extract.output_dir/regenerated.jsonl``, keyed by conversation and sampling settings), so neither
    regenerates through the 32-layer capture server, which took 175 s for 2,000 answers on the H200."""
    from eaglebox.engine.launch import server_for
    from eaglebox.extract.http import Client
    from eaglebox.extract.plan import select_rows
    from eaglebox.extract.regenerate import cached_rows, regenerate
    from eaglebox.target.tokenizer import load_tokenizer

    cfg = cfg_now(*overrides, *REGENERATE, f"model.path={WORK / 'shallow'}")
    e, out = cfg.extract, Path(cfg.extract.output_dir)
    rows = select_rows(e, log)
    if cached_rows(e, rows, out) is not None:
        return
    t0 = time.monotonic()
    with server_for(cfg, "plain", WORK / "logs" / "regenerate-server.log") as srv:
        log(f"regenerate: the 4-layer model's server up in {srv.startup_s:.0f} s; {len(rows):,} prompts")
        t1 = time.monotonic()
        regenerate(e, rows, Client(srv.url, e.max_retries, e.retry_backoff_s, srv.alive), load_tokenizer(cfg.model),
                   out, log)
        s = time.monotonic() - t1
    RESULT["regenerate"] = {"prompts": len(rows), "server_start_s": round(srv.startup_s, 1), "s": round(s, 1),
                            "prompts_per_s": round(len(rows) / s, 1), "overrides": [*overrides, *REGENERATE],
                            "total_s": round(time.monotonic() - t0, 1)}
    log(f"regenerate: {len(rows):,} answers in {s:.0f} s ({len(rows) / s:.1f}/s)")
    save()


def bench_overrides() -> list[str]:
    """Every server of the bench at once on a GPU of over 100 GB (an H200: one batch, one target), else
    the config's three (an H100's 80 GB: the chain sweep in a second batch)."""
    if torch.cuda.get_device_properties(0).total_memory < 100e9:
        return []
    return ["bench.servers_at_once=5"]


def stage(verb: str, done: Path, *overrides: str) -> None:
    if done.exists():
        return
    if eaglebox(verb, *overrides):
        raise RuntimeError(f"eaglebox {verb} failed; see logs/{verb}.log")


# ---------------------------------------------------------------- online against offline (issue 31, item 4)

def steady_tok_s(metrics: Path, skip: int) -> float:
    """Trainer tokens/s between its ``skip``-th logged row and its last (past process start, the first
    batches' CUDA graphs and the loader's first fill), from the rows' tokens/s and elapsed seconds."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    a, b = rows[min(skip, len(rows) - 2)], rows[-1]
    return (b["tokens_per_s"] * b["elapsed_s"] - a["tokens_per_s"] * a["elapsed_s"]) / (b["elapsed_s"] - a["elapsed_s"])


def capture_alone_tok_s(cfg, samples: int) -> float:
    """The running capture server alone over the first ``samples`` samples in batches, as the loader asks
    (``OnlineSamples.get_many``, ``train.loader_threads`` batches ahead): what it supplies when nothing else
    uses the GPU."""
    from eaglebox.extract.online import online_samples
    from eaglebox.shards.spec import capture_spec
    from eaglebox.train.data import prefetch

    b = cfg.train.batch_size
    with online_samples(cfg, capture_spec(cfg), log=lambda *m: None) as s:
        batches = [list(range(i, i + b)) for i in range(0, min(samples, len(s)) - b + 1, b)]
        t0 = time.monotonic()
        for _ in prefetch(s.get_many, batches, cfg.train.loader_threads):
            pass
        return sum(s.rows(i) for batch in batches for i in batch) / (time.monotonic() - t0)


def stage_online(rounds: int, steps: int, mem_fraction: float) -> None:
    """``eaglebox train`` on the extracted shards (offline) and with ``train.data=online`` against one
    capture server on the same GPU (the same samples: extract's, its regenerated answers cached), in
    alternating rounds of ``steps`` steps from scratch with no held-out evaluation; plus the server capturing
    alone. The server takes ``mem_fraction`` of the GPU, the trainer the rest; each round is saved as it ends."""
    from eaglebox.engine.launch import server_for
    from eaglebox.shards.spec import capture_spec

    res = RESULT.setdefault("online", {"rounds": []})
    if res.get("done"):
        return
    shared = [f"extract.max_samples={RESULT['disk']['max_samples']}", f"engine.mem_fraction_static={mem_fraction}",
              "engine.max_total_tokens=100000", f"train.max_steps={steps}", "train.heldout_share=0",
              "train.export=last", f"train.checkpoint_every={steps}", "train.log_every=5"]
    spool = WORK / "online-spool"
    cfg = cfg_now(*shared, "train.data=online", f"train.online.spool_dir={spool}")
    res.update(steps=steps, mem_fraction_static=mem_fraction, overrides=shared)
    with server_for(cfg, "capture", WORK / "logs" / "online-capture-server.log", capture_dir=spool,
                    layer_ids=list(capture_spec(cfg).layers.layer_ids)) as srv:
        log(f"online: capture server up in {srv.startup_s:.0f} s (mem_fraction_static {mem_fraction})")
        online = [*shared, "train.data=online", f"train.online.url={srv.url}", f"train.online.spool_dir={spool}"]
        for rnd in range(len(res["rounds"]) + 1, rounds + 1):
            row = {"round": rnd}
            modes = [("offline", shared), ("online", online)]
            for mode, overrides in modes[::-1] if rnd % 2 == 0 else modes:
                out = WORK / f"online-r{rnd}-{mode}"
                shutil.rmtree(out, ignore_errors=True)
                if eaglebox("train", *overrides, f"train.output_dir={out}", log_name=f"online-r{rnd}-{mode}"):
                    raise RuntimeError(f"online stage: eaglebox train ({mode}) failed; see logs/online-r{rnd}-{mode}.log")
                row[f"{mode}_tok_s"] = round(steady_tok_s(out / "metrics.jsonl", skip=2))
            row["capture_alone_tok_s"] = round(capture_alone_tok_s(cfg_now(*online), steps * cfg.train.batch_size))
            row["online_over_offline"] = round(row["online_tok_s"] / row["offline_tok_s"], 3)
            res["rounds"].append(row)
            log(f"online round {rnd}: {row}")
            save()
    ratios = [r["online_over_offline"] for r in res["rounds"]]
    res.update(median=sorted(ratios)[len(ratios) // 2], worst=min(ratios), done=True)
    save()


# ---------------------------------------------------------------- decode reference

def llama8b_shape() -> Path:
    """A Llama-3.1-8B config.json alone (vocab 128,256, 32 layers, hidden 4096, 32/8 heads, intermediate
    14336, bf16): SGLang serves it with ``--load-format dummy`` (random weights), token ids in."""
    d = WORK / "llama-3.1-8b-shape"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "num_hidden_layers": 32, "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
        "attention_bias": False, "mlp_bias": False, **WIDE}, indent=1))
    return d


def decode_ms(url: str, prompts: list[list[int]], new: int) -> float:
    """Milliseconds a token at concurrency 1 (one request at a time, ``ignore_eos``: every request decodes
    ``new`` tokens)."""
    from eaglebox.bench.served import run_prompts

    r = run_prompts(url, prompts, new, 1, ignore_eos=True)
    return 1000 * r["wall_s"] / r["completion_tokens"]


def target_shape() -> Path:
    """The padded target's config.json and tokenizer without weights (served with ``--load-format
    dummy``): its decode cost, where no trained target exists (values do not change what a step reads)."""
    from transformers import AutoTokenizer

    d = WORK / "target-shape"
    tok = AutoTokenizer.from_pretrained(CORPUS / "tokenizer")
    tok.save_pretrained(d)
    target_config(tok, LAYERS, architectures=["LlamaForCausalLM"], torch_dtype="bfloat16").save_pretrained(d)
    return d


def stage_decode_reference(rounds: int = 3, new: int = 128, shape: Path | None = None) -> None:
    """Target and random-weights Llama-3.1-8B shape served plain side by side; ms/token at concurrency 1
    in alternating rounds (the same token ids into both: every id is below both vocabularies). With
    ``shape``, the target's shape with random weights stands in for the target."""
    from eaglebox.bench.rounds import server_cfg
    from eaglebox.engine.launch import server_for
    from eaglebox.engine.server import free_port
    from eaglebox.extract.prompts import heldout_prompts
    from eaglebox.target.tokenizer import load_tokenizer

    if "decode_reference" in RESULT:
        return
    cfg = cfg_now()
    dummy = "engine.extra_args=" + json.dumps([*cfg.engine.extra_args, "--load-format", "dummy", "--skip-tokenizer-init"])
    if shape is not None:
        cfg = cfg_now(f"model.path={shape}", dummy)
    prompts = heldout_prompts(cfg, load_tokenizer(cfg.model))[:4]
    ref_cfg = cfg_now(f"model.path={llama8b_shape()}", dummy)
    servers = {"target": server_for(server_cfg(cfg, free_port(), None), "plain", WORK / "logs" / "decode-target.log"),
               "llama8b_random": server_for(server_cfg(ref_cfg, free_port(), None), "plain",
                                            WORK / "logs" / "decode-llama8b.log")}
    rows = []
    try:
        for s in servers.values():
            s.launch()
        for s in servers.values():
            s.wait()
            decode_ms(s.url, prompts[:1], 16)  # warm-up
        for rnd in range(1, rounds + 1):
            row = {"round": rnd} | {name: round(decode_ms(s.url, prompts, new), 3) for name, s in servers.items()}
            row["target_over_llama8b"] = round(row["target"] / row["llama8b_random"], 3)
            rows.append(row)
            log(f"decode reference round {rnd}: {row}")
    finally:
        for s in servers.values():
            s.stop()
    ratios = sorted(r["target_over_llama8b"] for r in rows)
    RESULT["decode_reference"] = {"target": "its shape, random weights" if shape else "the trained target", "concurrency": 1, "requests": len(prompts), "new_tokens": new, "rounds": rows,
                                  "ratio_median": ratios[len(ratios) // 2],
                                  "ratio_farthest_from_1": max(ratios, key=lambda x: abs(x - 1))}
    save()


# ---------------------------------------------------------------- worker and follower

def work(a) -> None:
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    if (WORK / "served.json").exists():
        RESULT.update(json.loads((WORK / "served.json").read_text()))
    RESULT.setdefault("workers", []).append({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:],
                                             "gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "none",
                                             "torch": torch.__version__})
    save()
    try:
        if a.decode_reference_only:
            write_data()
            stage_decode_reference(shape=target_shape())
            return
        site = start_site_build(a.online_train) if a.online_train else None
        stage_target(a)
        write_data()
        cfg = cfg_now()
        if a.online_train:
            data = online_dataset(site, a.online_train)
            stage_regenerate(*data)
            stage("train", Path(cfg.serve.draft_path) / "config.json",
                  *online_train_overrides(data, a.online_mem_fraction), *a.train_overrides)
        else:
            manifest = Path(cfg.extract.output_dir) / "manifest.json"
            if not manifest.exists():  # a resumed worker keeps the disk figures the extraction ran with
                fit = fit_samples(cfg_now(*a.extract_overrides))
                stage_regenerate(*a.extract_overrides, fit)
                stage("extract", manifest, *a.extract_overrides, fit)
            if a.online_only:
                stage_online(a.online_rounds, a.online_steps, a.online_mem_fraction)
                RESULT["done"] = True
                return
            stage("train", Path(cfg.serve.draft_path) / "config.json", *a.train_overrides)
        try:
            if DEVICE == "cuda":  # on the CPU, speculation runs Triton's interpreter: minutes a token at 32 layers
                stage("bench", Path(cfg.bench.output_dir) / "bench.png", *bench_overrides(), *a.bench_overrides)
        finally:  # a bench cut short still leaves the decode reference to measure
            if a.decode_reference:
                stage_decode_reference()
        RESULT["done"] = True
    except Exception as err:
        RESULT.setdefault("errors", []).append(f"{type(err).__name__}: {err}")
        log(f"ERROR {type(err).__name__}: {err}")
        raise
    finally:
        save()


def collect() -> None:
    """WORK's results into $OUT (at most 8 files come back from a call)."""
    cfg = cfg_now()
    shards, train, bench = Path(cfg.extract.output_dir), Path(cfg.train.output_dir), Path(cfg.bench.output_dir)
    for p in (WORK / "served.json", WORK / "served.log", bench / "bench.json", bench / "bench.png",
              train / "curves.png"):
        if p.exists():
            shutil.copy(p, OUT / p.name)
    with tarfile.open(OUT / "logs.tar.gz.tmp", "w:gz") as tar:
        for p in [*(WORK / "logs").glob("*.log"), WORK / "worker.log", shards / "corpus.json", shards / "manifest.json",
                  site_dir() / "site-manifest.json",
                  *(train / n for n in ("metrics.jsonl", "evals.jsonl", "report.json", "capture-server.log")),
                  *bench.glob("server-*.log"),
                  CONFIG]:
            if p.exists():
                tar.add(p, arcname=p.name)
    (OUT / "logs.tar.gz.tmp").replace(OUT / "logs.tar.gz")


def main() -> None:
    global CONFIG, WORK, DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--follow-s", type=float, default=570, help="return after this many seconds (the worker runs on)")
    ap.add_argument("--worker", action="store_true", help="(internal) run the stages")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--target-steps", type=int, default=500)
    ap.add_argument("--target-seq-len", type=int, default=768)
    ap.add_argument("--target-batch", type=int, default=20)
    ap.add_argument("--extract-override", dest="extract_overrides", action="append", default=[],
                    help="config overrides for extraction alone (e.g. a larger KV pool: it runs alone on the GPU)")
    ap.add_argument("--train-override", dest="train_overrides", action="append", default=[],
                    help="config overrides for training alone (e.g. fewer steps where less device time is left)")
    ap.add_argument("--bench-override", dest="bench_overrides", action="append", default=[],
                    help="config overrides for the bench alone (e.g. no chain sweep: bench.chains=[])")
    ap.add_argument("--no-decode-reference", dest="decode_reference", action="store_false")
    ap.add_argument("--decode-reference-only", action="store_true",
                    help="only the decode cost: the target's shape and Llama-3.1-8B's, random weights, side by side")
    ap.add_argument("--online-only", action="store_true",
                    help="issue 31: after extract, only trainer tokens/s online vs offline (no draft training, no bench)")
    ap.add_argument("--online-train", type=int, default=None, metavar="N",
                    help="issue 39: no extraction; the draft trains with train.data=online over the first N rows of "
                         "the stdlib's and the installed packages' windows (built here), then the bench as usual")
    ap.add_argument("--online-rounds", type=int, default=3)
    ap.add_argument("--online-steps", type=int, default=60)
    ap.add_argument("--online-mem-fraction", type=float, default=0.45,
                    help="the capture server's engine.mem_fraction_static beside the trainer (--online-only, --online-train)")
    ap.add_argument("--smoke", action="store_true",
                    help="on the CPU, a tiny width and no bench (pass a CPU --config): the flow, not the figures")
    ap.add_argument("--work", type=Path, default=WORK)
    a = ap.parse_args()
    if a.online_train is not None and (a.online_train < 1 or a.online_only or a.extract_overrides):
        ap.error("--online-train N takes N >= 1, and neither --online-only nor --extract-override (it extracts nothing)")
    CONFIG = a.config.resolve()
    WORK = a.work
    if a.smoke:
        DEVICE = "cpu"
        WIDE.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    if a.worker:
        work(a)
    else:
        follow(__file__, WORK, "served", a.follow_s, collect, START)


if __name__ == "__main__":
    main()
