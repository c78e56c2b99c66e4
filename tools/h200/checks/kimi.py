"""H100/H200, issue 41: the Kimi path at Kimi-K2.5's widths through real SGLang 0.5.23, both draft forms.

Stages, each skipped when its output exists (a run cut short continues where it stopped):

1. **probe**: SGLang serves the target's shape with random weights (``--load-format dummy``) and decodes:
   the MLA and MoE kernels at Kimi's widths start and run before any minute goes to the target, and the
   JIT and Triton kernels they compile are cached for every later server. Its ms/token is recorded.
2. **target** (:mod:`eaglebox_dev.kimi_width`): 4 layers (dense, 3 MoE) of Kimi-K2.5's attention and
   expert shapes trained on the served check's code corpus, placed among pass-through layers (attention
   ``o_proj`` and every ``down_proj`` zero); the padded logits are checked against the shallow ones.
3. ``eaglebox extract`` with regeneration (greedy, as the bench decodes), then ``eaglebox parity`` on the
   captured layers in the background (an fp32 forward on the host's cores while the GPU trains).
4. ``eaglebox train`` twice on the same shards: the Llama-form draft (the target's RoPE, as a user's
   config gets it) and the ``deepseek_mla`` form (default RoPE, what the trainer implements for it).
5. ``eaglebox bench`` for each form against one target server started once for both (``bench.target_url``):
   target alone, trained draft (and, beside the first form, the random control) side by side, concurrency 1
   and 8, 3 rounds, outputs diffed against the target's greedy ones.

A device call is at most 10 minutes, so the stages run in a worker in its own session and each call
(``kimi.py --follow-s S``) starts it unless it runs and copies its results to $OUT until it ends or S
seconds pass (as ``served.py`` does). Results: ``kimi.json``, ``kimi.log``, ``bench-llama.json``,
``bench-deepseek_mla.json``, ``parity.json``, ``logs.tar.gz``.

    bash tools/h200/run.sh kimi --follow-s 550
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import follow, log_line, save_json  # noqa: E402
from served import bench_overrides, decode_ms  # noqa: E402

from eaglebox_dev.kimi_width import KIMI, SMOKE, logits_diff, make_shallow, pad_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(os.environ.get("OUT", "/tmp/out"))
CORPUS = ROOT / ".cache" / "h200" / "carry" / "code"  # eaglebox_dev.code_corpus's output, as served.py's
WORK = Path("/tmp/h200-kimi")
CONFIG = ROOT / "configs" / "h200-kimi.yaml"
FORMS = {
    "llama": [],
    "deepseek_mla": ["train.draft.architecture=deepseek_mla", 'train.draft.rope_scaling={"rope_type": "default"}'],
}
"""Each draft form's overrides of the config's train section; its paths are :func:`form_overrides`'s."""
START = time.monotonic()
RESULT: dict = {}
A: argparse.Namespace  # the parsed arguments, set by main


def log(msg: str) -> None:
    log_line(WORK / "kimi.log", msg, START)


def save() -> None:
    save_json(WORK / "kimi.json", RESULT)


def cfg_now(*overrides: str):
    from eaglebox.config import load_config

    return load_config(CONFIG, list(overrides))


def form_overrides(form: str) -> list[str]:
    """The form's train overrides and its own training, draft and bench directories under WORK."""
    train = WORK / f"train-{form}"
    return [*FORMS[form], f"train.output_dir={train}", f"serve.draft_path={train / 'draft'}",
            f"bench.output_dir={WORK / f'bench-{form}'}"]


# ---------------------------------------------------------------- probe and target

def stage_probe() -> None:
    """The target's shape (config.json and tokenizer, no weights) served plain with random weights;
    ms/token at concurrency 1 over 4 held-out prompts."""
    from transformers import AutoTokenizer

    from eaglebox.bench.rounds import server_cfg
    from eaglebox.engine.launch import server_for
    from eaglebox.engine.server import free_port
    from eaglebox.extract.prompts import heldout_prompts
    from eaglebox.target.tokenizer import load_tokenizer
    from eaglebox_dev.kimi_width import target_config

    if "probe" in RESULT:
        return
    shape = WORK / "target-shape"
    tok = AutoTokenizer.from_pretrained(CORPUS / "tokenizer")
    tok.save_pretrained(shape)
    special = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    (shape / "config.json").write_text(json.dumps(target_config(len(tok), special, A.layers, A.widths), indent=1))
    cfg = cfg_now(f"model.path={shape}",
                  "engine.extra_args=" + json.dumps([*cfg_now().engine.extra_args, "--load-format", "dummy"]))
    prompts = heldout_prompts(cfg, load_tokenizer(cfg.model))[:4]
    t0 = time.monotonic()
    with server_for(server_cfg(cfg, free_port(), None), "plain", WORK / "logs" / "probe.log") as srv:
        startup = srv.startup_s
        decode_ms(srv.url, prompts[:1], 16)  # warm-up
        ms = decode_ms(srv.url, prompts, 64)
    RESULT["probe"] = {"startup_s": round(startup, 1), "decode_ms_per_token_c1": round(ms, 3),
                       "s": round(time.monotonic() - t0, 1)}
    log(f"probe: the target's shape served in {startup:.0f} s, {ms:.2f} ms/token at concurrency 1")
    save()


def train_rows() -> list[str]:
    return lzma.decompress((CORPUS / "train.jsonl.xz").read_bytes()).decode().splitlines()


def stage_target() -> None:
    target = Path(cfg_now().model.path)
    if (target / "config.json").exists():
        return
    t0 = time.monotonic()
    shallow = WORK / "shallow"
    if not (shallow / "config.json").exists():
        convs = [json.loads(r)["messages"] for r in train_rows()]
        recipe = {"steps": A.target_steps, "seq_len": A.target_seq_len, "batch_size": A.target_batch, "lr": 6e-4,
                  "seed": 0}
        RESULT["target_training"] = make_shallow(shallow, CORPUS / "tokenizer", convs, recipe, A.widths,
                                                 device=A.device, log=log)
        RESULT["target_training"]["s"] = round(time.monotonic() - t0, 1)
        log(f"target: shallow model trained in {time.monotonic() - t0:.0f} s, "
            f"final loss {RESULT['target_training']['final_loss']}")
        if A.device == "cuda":
            torch.cuda.empty_cache()  # the worker's cached blocks would stay out of the servers' reach
    pad_target(shallow, target, A.layers, device=A.device)
    padded = json.loads((target / "eaglebox-padded.json").read_text())
    RESULT["target"] = {**padded, "bytes": sum(f.stat().st_size for f in target.glob("*.safetensors")),
                        "s": round(time.monotonic() - t0, 1)}
    log(f"target: padded to {A.layers} layers (trained at {padded['trained_layers_at']}) -> {target}")
    RESULT["pass_through_max_abs_logit_diff"] = logits_diff(shallow, target, device=A.device)
    log(f"target: padded vs shallow logits (bf16), max abs diff {RESULT['pass_through_max_abs_logit_diff']}")
    if A.device == "cuda":
        torch.cuda.empty_cache()
    shutil.rmtree(shallow)  # its disk goes to the shards
    save()


def write_data() -> None:
    """The extraction prompts (the corpus's train rows) and the held-out bench prompts, where the config names them."""
    cfg = cfg_now()
    for path, text in ((Path(cfg.extract.dataset), lambda: "\n".join(train_rows()) + "\n"),
                       (Path(cfg.bench.prompts), lambda: (CORPUS / "heldout.jsonl").read_text())):
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text())


# ---------------------------------------------------------------- extract, parity, train, bench

def eaglebox(verb: str, *overrides: str, log_name: str) -> int:
    cmd = [sys.executable, "-m", "eaglebox.cli", verb, "--config", str(CONFIG), *overrides]
    log("run: eaglebox " + " ".join(cmd[3:]))
    t0 = time.monotonic()
    with open(WORK / "logs" / f"{log_name}.log", "ab") as logf:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT).returncode
    RESULT.setdefault("stages", []).append({"verb": verb, "name": log_name, "overrides": list(overrides), "rc": rc,
                                            "s": round(time.monotonic() - t0, 1)})
    log(f"{log_name}: exit {rc} in {time.monotonic() - t0:.0f} s")
    save()
    return rc


def stage(verb: str, done: Path, *overrides: str, log_name: str) -> None:
    if done.exists():
        return
    if eaglebox(verb, *overrides, log_name=log_name):
        raise RuntimeError(f"eaglebox {verb} failed; see logs/{log_name}.log")


def training_bytes(cfg) -> int:
    """Disk the trainings and benches hold beside the shards: one form's last checkpoint at a time (fp32
    weights and Adam's two moments, 16 B a parameter; removed once its training ends) and every form's
    bf16 drafts (draft, draft-best, draft-last and the bench's control). Parameters of the larger form,
    the Llama one: fc, attention, MLP, embedding and lm_head."""
    H, inter, vocab = A.widths["hidden_size"], A.widths["intermediate_size"], cfg.train.draft.draft_vocab_size
    params = 3 * H * H + 4 * H * H + 3 * H * inter + 2 * H * vocab
    return params * (16 + len(FORMS) * 4 * 2)


def fit_samples(cfg, tokens_a_sample: int = 450, keep_free: float = 0.1) -> str:
    """``extract.max_samples``, lowered to what the free disk holds after :func:`training_bytes` (4 x hidden
    bf16 a token; ~150 prompt and up to the regenerated answer's tokens a sample), keeping ``keep_free``
    of it free."""
    free = shutil.disk_usage(Path(cfg.extract.output_dir).parent).free
    reserve = training_bytes(cfg)
    fits = max(0, int((free - reserve) * (1 - keep_free) / (tokens_a_sample * (4 * A.widths["hidden_size"] * 2 + 9))))
    n = min(cfg.extract.max_samples, fits)
    RESULT["disk"] = {"free_gb": round(free / 1e9, 1), "training_gb": round(reserve / 1e9, 1), "samples_fit": fits,
                      "max_samples": n}
    log(f"extract: {free / 1e9:.1f} GB free, {reserve / 1e9:.1f} GB kept for training: {fits} samples fit, "
        f"extracting {n}")
    if n < 1:
        raise RuntimeError("no disk left for the shards; see kimi.json's disk")
    return f"extract.max_samples={n}"


def start_parity() -> subprocess.Popen | None:
    """``eaglebox parity`` in the background: its report is stdout (``parity.json``), the rest ``parity.log``.
    It runs on the host's cores, a few left to the trainer's loader and SGLang's scheduler."""
    if (WORK / "parity.json").exists():
        return None
    log("parity: eaglebox parity in the background")
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) - 4))}
    return subprocess.Popen([sys.executable, "-m", "eaglebox.cli", "parity", "--config", str(CONFIG)], cwd=ROOT, env=env,
                            stdout=open(WORK / "parity.json.tmp", "wb"), stderr=open(WORK / "logs" / "parity.log", "ab"))


def finish_parity(proc: subprocess.Popen | None) -> None:
    """Wait for the background parity; its report, per captured layer, into the result."""
    if proc is not None:
        t0 = time.monotonic()
        rc = proc.wait()
        log(f"parity: exit {rc} ({time.monotonic() - t0:.0f} s waited)")
        if rc not in (0, 1):  # 1: ran, a layer mismatched (the report says which)
            raise RuntimeError("eaglebox parity failed; see logs/parity.log")
        (WORK / "parity.json.tmp").replace(WORK / "parity.json")
    if (WORK / "parity.json").exists():
        p = json.loads((WORK / "parity.json").read_text())
        RESULT["parity"] = {"ok": p["ok"], "samples": p["samples"], "tokens": p["tokens"], "last_cos": p["last"]["cos"],
                            "aux": [{k: x[k] for k in ("layer_id", "reference_index", "best_reference_index", "cos")}
                                    for x in p["aux"]]}
        log(f"parity: {RESULT['parity']}")
        save()


def offline_al(form: str) -> None:
    """The held-out AL the trainer measured offline (SGLang's draft class), beside the served one, with the
    best draft's acceptance per position and the training kernels' check (the first run's drafts failed after
    their first draft token: docs/kimi-gpu.md)."""
    report = WORK / f"train-{form}" / "report.json"
    if report.exists():
        r = json.loads(report.read_text())
        RESULT.setdefault("offline", {})[form] = {
            k: (r.get(k) or {}).get("accept_length") for k in ("best", "last", "untrained")} | {
            "exported_step": r.get("exported_step"), "steps": r.get("steps"),
            "best_per_position": (r.get("best") or {}).get("accept_rate_per_position"),
            "attention": r.get("attention")}
        save()


@contextmanager
def shared_target(cfg):
    """The target alone, started once for both forms' benches (``bench.target_url``) as ``eaglebox bench``
    starts it: one target server's start and weights fewer than a target per bench. None once every bench
    is done."""
    from eaglebox.bench.rounds import server_cfg
    from eaglebox.engine.launch import server_for
    from eaglebox.engine.server import free_port

    if all((WORK / f"bench-{form}" / "bench.png").exists() for form in FORMS):
        yield None
        return
    with server_for(server_cfg(cfg, free_port(), None), "plain", WORK / "logs" / "bench-target.log",
                    warmup=False) as srv:  # as the bench starts its own: its rounds warm every server up
        RESULT["bench_target_startup_s"] = round(srv.startup_s, 1)
        log(f"bench: the target alone up in {srv.startup_s:.0f} s, shared by both forms' benches")
        yield srv.url


def served_summary(form: str) -> None:
    bench = WORK / f"bench-{form}" / "bench.json"
    if bench.exists():
        b = json.loads(bench.read_text())
        RESULT.setdefault("served", {})[form] = {"summary": b.get("summary"),
                                                 "outputs_equal_target_greedy": b.get("outputs_equal_target_greedy")}
        save()


# ---------------------------------------------------------------- worker and follower

def work() -> None:
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    if (WORK / "kimi.json").exists():
        RESULT.update(json.loads((WORK / "kimi.json").read_text()))
    RESULT.setdefault("workers", []).append({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:],
                                             "gpu": torch.cuda.get_device_name(0) if A.device == "cuda" else "none",
                                             "torch": torch.__version__})
    save()
    parity = None
    try:
        write_data()
        if A.probe:
            stage_probe()
        stage_target()
        cfg = cfg_now()
        manifest = Path(cfg.extract.output_dir) / "manifest.json"
        if not manifest.exists():
            stage("extract", manifest, *A.extract_overrides, fit_samples(cfg_now(*A.extract_overrides)),
                  log_name="extract")
        parity = start_parity()
        for form in FORMS:
            stage("train", WORK / f"train-{form}" / "draft" / "config.json", *form_overrides(form), *A.train_overrides,
                  log_name=f"train-{form}")
            shutil.rmtree(WORK / f"train-{form}" / "checkpoints", ignore_errors=True)  # the next form's disk
            offline_al(form)
        finish_parity(parity)
        parity = None
        if A.bench:
            over = bench_overrides() if A.device == "cuda" else []
            with shared_target(cfg_now()) as url:
                for i, form in enumerate(FORMS):
                    # the random control once, beside the first form: its AL (~1) does not depend on the form
                    stage("bench", WORK / f"bench-{form}" / "bench.png", *form_overrides(form), *over,
                          f"bench.target_url={url}", *(["bench.control=false"] if i else []), *A.bench_overrides,
                          log_name=f"bench-{form}")
                    served_summary(form)
        RESULT["done"] = True
    except Exception as err:
        RESULT.setdefault("errors", []).append(f"{type(err).__name__}: {err}")
        log(f"ERROR {type(err).__name__}: {err}")
        raise
    finally:
        if parity is not None:
            parity.wait()  # a worker started again would otherwise run a second one beside it
        save()


def collect() -> None:
    """WORK's results into $OUT (at most 8 files come back from a call)."""
    cfg = cfg_now()
    for p in (WORK / "kimi.json", WORK / "kimi.log", WORK / "parity.json"):
        if p.exists():
            shutil.copy(p, OUT / p.name)
    for form in FORMS:
        if (WORK / f"bench-{form}" / "bench.json").exists():
            shutil.copy(WORK / f"bench-{form}" / "bench.json", OUT / f"bench-{form}.json")
    with tarfile.open(OUT / "logs.tar.gz.tmp", "w:gz") as tar:
        for p in [*(WORK / "logs").glob("*.log"), WORK / "worker.log", Path(cfg.extract.output_dir) / "manifest.json",
                  CONFIG]:
            if p.exists():
                tar.add(p, arcname=p.name)
        for form in FORMS:
            for p in [*(WORK / f"train-{form}" / n for n in ("metrics.jsonl", "evals.jsonl", "report.json")),
                      *(WORK / f"bench-{form}").glob("server-*.log")]:
                if p.exists():
                    tar.add(p, arcname=f"{form}/{p.name}")
    (OUT / "logs.tar.gz.tmp").replace(OUT / "logs.tar.gz")


def main() -> None:
    global CONFIG, WORK, A
    ap = argparse.ArgumentParser()
    ap.add_argument("--follow-s", type=float, default=550, help="return after this many seconds (the worker runs on)")
    ap.add_argument("--worker", action="store_true", help="(internal) run the stages")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--layers", type=int, default=10, help="the padded target's layers (the config's capture must fit)")
    ap.add_argument("--target-steps", type=int, default=250)
    ap.add_argument("--target-seq-len", type=int, default=512)
    ap.add_argument("--target-batch", type=int, default=8)
    ap.add_argument("--extract-override", dest="extract_overrides", action="append", default=[],
                    help="config overrides for extraction alone (e.g. a larger KV pool: it runs alone on the GPU)")
    ap.add_argument("--train-override", dest="train_overrides", action="append", default=[],
                    help="config overrides for both trainings (e.g. fewer steps where less device time is left)")
    ap.add_argument("--bench-override", dest="bench_overrides", action="append", default=[],
                    help="config overrides for both benches (e.g. bench.rounds=2 where less device time is left)")
    ap.add_argument("--probe", action=argparse.BooleanOptionalAction, default=None,
                    help="the probe stage (default: on a GPU, not with --smoke)")
    ap.add_argument("--no-bench", dest="bench", action="store_false")
    ap.add_argument("--smoke", action="store_true",
                    help="on the CPU at the smoke width (pass a CPU --config): the flow, not the figures")
    ap.add_argument("--work", type=Path, default=WORK)
    A = ap.parse_args()
    CONFIG, WORK = A.config.resolve(), A.work
    A.device, A.widths = ("cpu", SMOKE) if A.smoke else ("cuda", KIMI)
    A.probe = not A.smoke if A.probe is None else A.probe
    if A.worker:
        work()
    else:
        follow(__file__, WORK, "kimi", A.follow_s, collect, START)


if __name__ == "__main__":
    main()
