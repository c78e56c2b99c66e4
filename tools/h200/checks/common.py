"""Shared by the H200 checks: random-weight Llama targets, eaglebox configs for them, capture through
eaglebox's own client and server launch, a bf16 transformers forward on the same GPU as reference, and the
worker that outlives a device call (served, kimi, int4)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/h200-checks")
WIDE = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8}
SMALL = {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4}
VOCAB = 32000


def make_llama(name: str, layers: int, shape: dict, seed: int = 0) -> Path:
    """A random-weight Llama (transformers' own init), bf16, saved once under /tmp."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = WORK / f"{name}-{layers}l"
    if not (path / "config.json").exists():
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=VOCAB, num_hidden_layers=layers, max_position_embeddings=8192,
                             rms_norm_eps=1e-5, **shape)
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(path)
        del model
        torch.cuda.empty_cache()
    return path


def save_target(model, path: Path, files: list[Path]) -> Path:
    """``model`` in bf16 at ``path`` (config.json saying so) with ``files`` (tokenizer, chat template)
    beside it: written into a sibling and renamed into place, so a cut run leaves no target that looks made."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    for f in files:
        shutil.copy(f, tmp / f.name)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    tmp.replace(path)
    torch.cuda.empty_cache()
    return path


def config_for(model_path: Path, name: str, port: int, layer_ids: list[int], *extra_args: str,
               chunked_prefill: int | None = None, concurrency: int = 64, mem_fraction: float = 0.3,
               env: dict | None = None, extract: dict | None = None):
    """An eaglebox config for a GPU server on ``model_path`` (no tokenizer: requests send token ids);
    ``extract``: more keys of its extract section (e.g. ``capture_writers``)."""
    from eaglebox.config import load_config

    out = WORK / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "dataset.jsonl").write_text('{"text": "token ids are sent directly"}\n')
    raw = {
        "model": {"path": str(model_path), "dtype": "bfloat16"},
        "capture": {"layer_ids": layer_ids, "convention": "output_of_layer"},
        "engine": {"device": "cuda", "port": port, "attention_backend": "triton", "mem_fraction_static": mem_fraction,
                   "chunked_prefill_size": chunked_prefill, "startup_timeout_s": 500, "env": env or {},
                   "extra_args": ["--sampling-backend", "pytorch", "--skip-tokenizer-init", *extra_args]},
        "extract": {"dataset": str(out / "dataset.jsonl"), "output_dir": str(out / "shards"),
                    "concurrency": concurrency, "shard_size": 32, "max_length": 8192, **(extract or {})},
    }
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def random_prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def capture(cfg, prompts: list[list[int]], log_name: str):
    """Capture ``prompts`` through eaglebox's client and server launch; returns (ShardReader, spec, s)."""
    from eaglebox.engine.launch import server_for
    from eaglebox.extract.commit import feature_bound
    from eaglebox.extract.plan import Planned, sample_id
    from eaglebox.extract.run import run_extract
    from eaglebox.shards.format import ShardReader
    from eaglebox.shards.spec import capture_spec

    spec = capture_spec(cfg)
    planned = [Planned(sample_id(p, spec), i + 1, p, [1] * len(p)) for i, p in enumerate(prompts)]
    out = cfg.extract.output_dir
    staging = out / ".staging"
    srv = server_for(cfg, "capture", OUT / f"{log_name}.log", capture_dir=staging, layer_ids=list(spec.layers.layer_ids))
    with srv:
        print(f"{log_name}: server healthy after {srv.startup_s:.0f} s", flush=True)
        run_extract(cfg.extract, srv.url, spec, planned, None, staging, bound=feature_bound(cfg.model.path),
                    alive=srv.alive, log=lambda *_: None)
    return ShardReader(out), spec, srv


def row_cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


def compare(reader, spec, model) -> list[dict]:
    """Per sample and captured tensor: min row cosine and whole-tensor cosine against ``model``'s
    forward (hidden_states[k] is the input of layer k; the last entry is after the final norm)."""
    H = spec.hidden_size
    results = []
    with torch.no_grad():
        for i in range(len(reader)):
            s = reader.get(i)
            hs = model(s["input_ids"][None].cuda(), output_hidden_states=True).hidden_states
            pairs = [(f"aux[{c}]=input_of_{k}", s["aux"][:, c * H:(c + 1) * H], hs[k][0])
                     for c, k in enumerate(spec.layers.captured_layer_inputs)] + [("last", s["last"], hs[-1][0])]
            row = {"sample": i, "rows": int(s["input_ids"].numel())}
            for name, got, ref in pairs:
                got = got.cuda()
                row[name] = {"min_row_cos": round(row_cos(got, ref).min().item(), 6),
                             "cos": round(row_cos(got.flatten(), ref.flatten()).item(), 6)}
            results.append(row)
    return results


def load_reference(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()


def write_result(name: str, result: dict) -> None:
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=1))


# ---------------------------------------------------------------- a worker that outlives a device call

def log_line(path: Path, msg: str, start: float) -> None:
    """``msg`` printed and appended to ``path``, stamped with the clock and the seconds since ``start``."""
    line = f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - start:.0f}s] {msg}"
    print(line, flush=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def save_json(path: Path, result: dict) -> None:
    """``result`` written whole or not at all: a call can be taken back while the worker writes."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


def worker_pid(work: Path) -> int | None:
    """The worker's pid while it runs (not once it is a zombie), else None."""
    try:
        pid = int((work / "worker.pid").read_text())
        os.kill(pid, 0)
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0]
        return None if state == "Z" else pid
    except (OSError, ValueError):
        return None


def follow(script: str, work: Path, name: str, follow_s: float, collect: Callable[[], None], start: float) -> None:
    """A device call is at most 10 minutes and the machine goes back 30 s after one: start ``script
    --worker`` (this call's arguments less ``--follow-s``) in its own session unless one runs or the last one
    finished (``name``.json says done), then ``collect`` its results into $OUT every 10 s until it ends or
    ``follow_s`` seconds since ``start`` pass, and print the tail of ``name``.log."""
    OUT.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    argv = sys.argv[1:]
    if "--follow-s" in argv:
        i = argv.index("--follow-s")
        argv = argv[:i] + argv[i + 2:]
    pid = worker_pid(work)
    result = work / f"{name}.json"
    done = result.exists() and json.loads(result.read_text()).get("done")
    if pid is None and not done:
        with open(work / "worker.log", "ab") as f:
            pid = subprocess.Popen([sys.executable, script, "--worker", *argv], stdout=f, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=Path(script).resolve().parents[3]).pid
        (work / "worker.pid").write_text(str(pid))
        print(f"follow: started worker {pid}", flush=True)
    else:
        print(f"follow: worker {pid} running" if pid else "follow: the worker finished earlier", flush=True)
    while pid is not None and worker_pid(work) == pid and time.monotonic() - start < follow_s:
        time.sleep(10)
        collect()
    collect()
    log = work / f"{name}.log"
    print(log.read_text()[-6000:] if log.exists() else "(no log yet)", flush=True)
    print("follow: worker " + ("still running" if worker_pid(work) else "ended"), flush=True)
