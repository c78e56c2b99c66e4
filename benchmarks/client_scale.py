"""Client-side work per 1k samples from 5k to 20k samples, without a GPU and without SGLang (issue 29, item 3).

Everything ``eaglebox extract`` / ``check`` / ``train`` do around the capture server, at realistic size, with
the project's real code:

- **data set**: N chat rows (JSONL, ``messages``), each a short user prompt and an answer of 500-3,000 tokens
  of the tiny target's tokenizer (lengths uniform at random, fixed seed). Answers are runs of words from the
  Python standard library's source (the venv's interpreter, files sorted: the same text on every machine
  with this Python), 15 % of them with one passage of 30-150 words repeated 2-4 times, 2 % an exact copy of
  an earlier answer (after a distinct prompt). Row ``i`` is the same for every N (5k is the first 5k of 20k).
- **the server, replaced**: a stand-in process (this file, ``--serve``) answers ``/generate`` over HTTP as
  the patched SGLang server does. It replaces SGLang's scheduler, model forward and HTTP front end only:
  each request's rows are cut into 512-row chunks (chunked prefill) and handed to the project's REAL
  ``CaptureSink.add_chunk`` exactly as ``capture/hook.py`` calls it (rid ``eaglebox-<sid>-<nonce>``, the
  request's token ids, an owner object, one chunk at a time under one lock: the scheduler is one thread);
  the rows are random bf16 values (slices of a random pool, never written after creation) in place of the
  model's hidden states, at hidden width ``--hidden`` (16: the client never reads feature bytes except where
  it hashes them -- the resume check below -- so the width changes only the disk traffic). The sink's
  writer threads hash, write and fsync each sample file as in the server; the answer carries the sink's
  metadata dict, as the hook puts it in ``meta_info.hidden_states``.
- **the client, real**: ``prepare`` (read rows, tokenize with the tiny target's real tokenizer and chat
  template, plan, resume/disk check), ``run_extract`` (HTTP requests via ``Client``/``capture_one``, wait for
  files, ``verify_staged``, ``commit_shard`` with ``write_index``, the manifest after every shard), then
  ``corpus_report`` (``ShardReader`` + ``shard_answers`` + ``answer_stats``), the vocabulary pass
  (``ShardReader`` + ``draft_vocab``, as training does), a ``ShardReader`` open with a pass over every
  sample's ids and loss mask, and a resumed ``extract`` over the finished directory (``prepare`` +
  ``run_extract``: it re-verifies every committed sample, reading and hashing its feature bytes).
  The capture spec is the tiny target's (``capture_spec``) with ``hidden_size`` set to ``--hidden``.

Prints wall seconds and client-process CPU seconds per 1k samples for each phase and N, and the growth of
the per-1k cost from the smallest to the largest N; phases whose per-1k cost grows > 20 % are flagged.
The capture phase's wall time includes the stand-in server's work (sink writers on the same cores); its
client CPU does not (the server is another process).

    .venv/bin/python benchmarks/client_scale.py --samples 5000 10000 20000 [--workdir /tmp] [--profile PHASE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / ".cache" / "tiny" / "target"
CHUNK = 512  # rows per prefill chunk handed to the sink (SGLang's chunked prefill in the runs)
GROWTH_LIMIT = 1.20


# ---------------------------------------------------------------------------------------------- data set

def stdlib_words(limit: int = 3_000_000) -> list[str]:
    """Whitespace-separated words of the standard library's .py files (sorted paths), each at most 24 chars."""
    words: list[str] = []
    lib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(lib.glob("*.py")) + sorted(lib.glob("*/*.py")):
        if "test" in path.parent.name or path.name.startswith("test"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        words.extend(w for w in text.split() if len(w) <= 24)
        if len(words) >= limit:
            break
    return words[:limit]


def write_dataset(path: Path, n: int, tokenizer, seed: int = 0, lo: int = 500, hi: int = 3000) -> dict:
    """N rows whose full conversations (chat template included) tokenize to about ``lo``-``hi`` tokens
    (each answer's length estimated from its words' token counts: the tokenizer is byte-level BPE with
    a whitespace-splitting pre-tokenizer, so a word tokenizes alike alone and in the text)."""
    from eaglebox.extract.dataset import render_chat

    words = stdlib_words()
    vocab = sorted(set(words))
    lens = dict(zip(vocab, (len(x) for x in tokenizer([" " + w for w in vocab], add_special_tokens=False)["input_ids"])))
    frame = len(render_chat(tokenizer, [{"role": "user", "content": "Question 0:"},
                                        {"role": "assistant", "content": "x"}], None, generation_prompt=False))
    rng = random.Random(seed)
    answers: list[str] = []
    stats = {"repeated_passage": 0, "copies": 0}
    with open(path, "w") as f:
        for i in range(n):
            target = rng.randint(lo, hi)
            prompt_words = [words[rng.randrange(len(words))] for _ in range(rng.randint(8, 30))]
            prompt = f"Question {i}: " + " ".join(prompt_words)
            budget = target - frame - sum(lens[w] for w in prompt_words)
            if answers and rng.random() < 0.02:
                answer = answers[rng.randrange(len(answers))]  # an exact copy, after another prompt
                stats["copies"] += 1
            else:
                rep = None
                if rng.random() < 0.15:  # one passage said 2-4 times, somewhere in the answer
                    p0, plen = rng.randrange(len(words) - 200), rng.randint(30, 150)
                    passage = words[p0 : p0 + plen]
                    cost = sum(lens[w] for w in passage)
                    times = min(rng.randint(2, 4), budget // (2 * cost))
                    if times >= 2:
                        rep = (passage, times, cost, rng.random() * (budget - times * cost))
                        stats["repeated_passage"] += 1
                out, got, j = [], 0, rng.randrange(len(words) - 50_000)
                while got < budget:
                    if rep and got >= rep[3]:
                        out.extend(rep[0] * rep[1])
                        got += rep[1] * rep[2]
                        rep = None
                        continue
                    out.append(words[j])
                    got += lens[words[j]]
                    j += 1
                answer = " ".join(out)
            answers.append(answer)
            f.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    return stats


# ------------------------------------------------------------------------------------ stand-in server

def serve(port: int, staging: Path, spec_path: Path) -> None:
    """The server stand-in: /generate hands random rows to the real CaptureSink as capture/hook.py does."""
    import torch

    from eaglebox.capture.sink import CaptureSink
    from eaglebox.shards.requests import sample_id_from_rid

    spec = json.loads(spec_path.read_text())
    H, k = spec["hidden_size"], len(spec["layer_ids"])
    dtype = getattr(torch, spec["dtype"])
    g = torch.Generator().manual_seed(1)
    pool_rows = 8192
    aux_pool = torch.randn(pool_rows + CHUNK, k * H, generator=g).to(dtype)
    last_pool = torch.randn(pool_rows + CHUNK, H, generator=g).to(dtype)
    sink = CaptureSink(staging, header=spec)  # the whole spec, as capture_spec(...).sample_header() gives it
    scheduler = threading.Lock()  # SGLang's scheduler is one thread: add_chunk is never called concurrently
    rng = random.Random(2)

    class Req:  # the hook passes SGLang's Req as the owner of the pending rows
        pass

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids, rid = body["input_ids"], body["rid"]
            sid = sample_id_from_rid(rid)
            req, meta = Req(), None
            for a in range(0, len(ids), CHUNK):
                n = min(CHUNK, len(ids) - a)
                o = rng.randrange(pool_rows)
                with scheduler:
                    meta = sink.add_chunk(rid, sid, ids, aux_pool[o : o + n], last_pool[o : o + n], owner=req)
            out = json.dumps({"output_ids": [0], "meta_info": {"prompt_tokens": len(ids), "hidden_states": [meta]}})
            data = out.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    print(f"ready {srv.server_address[1]}", flush=True)
    srv.serve_forever()


# ------------------------------------------------------------------------------------------ the client

class Timer:
    """Wall and client-process CPU seconds per phase (CPU: all threads of this process)."""

    def __init__(self, profile: str | None):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.profile = profile
        self.profiles: dict[str, str] = {}

    @contextmanager
    def __call__(self, name: str):
        prof = cProfile.Profile() if self.profile and self.profile in name else None
        w, c = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        try:
            yield
        finally:
            if prof:
                prof.disable()
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
                self.profiles[name] = s.getvalue()
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c


def wrap(module, name: str, timer: Timer, label: str):
    """Time every call of ``module.name`` (the real function still runs) under ``label``."""
    fn = getattr(module, name)

    def timed(*a, **kw):
        with timer(label):
            return fn(*a, **kw)

    setattr(module, name, timed)
    return lambda: setattr(module, name, fn)


def replay_old_manifest_cadence(final: dict, folder: Path) -> None:
    """What the client did with the manifest before the fix (eaglebox 45c6b14, ``run_extract.finish``), replayed
    over this run's real final manifest: after every shard, append + sort the shard list, re-sum samples and
    tokens over all shards, and rewrite the whole manifest (the real ``save_manifest``)."""
    from eaglebox.shards.format import save_manifest

    folder.mkdir()
    m = {k: v for k, v in final.items() if k != "shards"} | {"shards": []}
    for entry in final["shards"]:
        m["shards"].append(entry)
        m["shards"].sort(key=lambda s: s["file"])
        m["samples"] = sum(len(s["samples"]) for s in m["shards"])
        m["tokens"] = sum(r["rows"] for s in m["shards"] for r in s["samples"])
        save_manifest(folder, m)


def one_size(n: int, source: Path, work: Path, hidden: int, shard_size: int, concurrency: int, profile: str | None,
             log, resume_check: bool = False) -> tuple[Timer, dict]:
    from eaglebox.config import load_config
    from eaglebox.extract import commit, diversity
    from eaglebox.extract import run as extract_run
    from eaglebox.shards import format as fmt
    from eaglebox.shards.spec import capture_spec
    from eaglebox.target.tokenizer import load_tokenizer
    from eaglebox.train.dist import Dist
    from eaglebox.train.vocab import draft_vocab

    work.mkdir(parents=True)
    data, out = work / "train.jsonl", work / "shards"
    cfg_path = work / "c.yaml"
    cfg_path.write_text(f"model:\n  path: {TINY}\n  dtype: bfloat16\ncapture:\n  layer_ids: [0, 1, 2]\n"
                        f"  convention: output_of_layer\nengine:\n  device: cpu\n")
    cfg = load_config(cfg_path, [f"extract.dataset={data}", "extract.format=messages", f"extract.output_dir={out}",
                                 "extract.max_length=4096", f"extract.shard_size={shard_size}",
                                 f"extract.concurrency={concurrency}"])
    tok = load_tokenizer(cfg.model)
    with open(source) as src, open(data, "w") as dst:
        for _ in range(n):
            dst.write(src.readline())
    info = {}
    spec = capture_spec(cfg).model_copy(update={"hidden_size": hidden})
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec.sample_header()))
    staging = commit.staging_dir(cfg.extract)
    bound = commit.feature_bound(cfg.model.path)
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(staging), str(spec_path)],
                              stdout=subprocess.PIPE, stderr=open(work / "server.log", "w"), text=True)
    try:
        port = int(server.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}"
        T = Timer(profile)
        undo = [wrap(extract_run, "commit_shard", T, "  commit_shard"), wrap(commit, "save_manifest", T, "  save_manifest"),
                wrap(extract_run, "wait_for_files", T, "  wait_for_files"),
                wrap(fmt, "ShardReader", T, "  ShardReader open"), wrap(diversity, "shard_answers", T, "  shard_answers"),
                wrap(diversity, "answer_stats", T, "  answer_stats")]
        try:
            with T("prepare"):
                plan = extract_run.prepare(cfg.extract, spec, tok, log=log)
            info["samples"] = len(plan.planned)
            lens = [len(p.input_ids) for p in plan.planned]
            info["tokens"] = sum(lens)
            info["len_min_mean_max"] = (min(lens), round(sum(lens) / len(lens)), max(lens))
            with T("capture+commit"):
                manifest = extract_run.run_extract(cfg.extract, url, spec, plan.planned, plan.manifest, staging, bound=bound,
                                                   log=log)
            assert manifest["samples"] == len(plan.planned)
            shutil.rmtree(staging, ignore_errors=True)
            with T("corpus report"):
                report = diversity.corpus_report(cfg.extract, tok)
            info["corpus"] = {k: report[k] for k in ("answers", "distinct_ratio", "repeated_ngram_dominant_share",
                                                     "max_repeated_ngram_share", "mean_words")}
            with T("vocab pass"):
                d2t, _ = draft_vocab(fmt.ShardReader(out), int(json.loads((TINY / "config.json").read_text())
                                                                ["vocab_size"]), 1024, Dist())
            with T("reader ids pass"):
                reader = fmt.ShardReader(out)
                total = 0
                for i in range(len(reader)):
                    ids, mask = reader.ids_and_mask(i)
                    total += int(mask.sum())
            if resume_check:
                again = extract_run.prepare(cfg.extract, spec, tok, log=lambda *a: None)  # as prepare above (not timed again)
                with T("resume check"):
                    extract_run.run_extract(cfg.extract, url, spec, again.planned, again.manifest, staging, bound=bound,
                                            log=log)
            with T("  [pre-fix] manifest every shard"):
                replay_old_manifest_cadence(json.loads((out / fmt.MANIFEST).read_text()), work / "replay")
        finally:
            for u in undo:
                u()
        info["disk_gb"] = round(sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e9, 2)
        info["manifest_mb"] = round((out / "manifest.json").stat().st_size / 1e6, 1)
        return T, info
    finally:
        server.terminate()
        server.wait()


PHASES = ["prepare", "capture+commit", "  wait_for_files", "  commit_shard", "  save_manifest", "corpus report",
          "  ShardReader open", "  shard_answers", "  answer_stats", "vocab pass", "reader ids pass", "resume check",
          "  [pre-fix] manifest every shard"]
NOTES = {"capture+commit": "wall incl. the stand-in server's sink writers", "  ShardReader open": "every open, all phases",
         "  [pre-fix] manifest every shard": "not run by the client now: 45c6b14's cadence replayed",
         "resume check": "run_extract on the finished dir: reads+hashes all feature bytes"}


def table(sizes: list[int], runs: dict[int, Timer], kind: str) -> tuple[list[str], list[str]]:
    lines, flagged = [], []
    head = f"{'phase (' + kind + ' s per 1k samples)':<36}" + "".join(f"{f'N={n:,}':>11}" for n in sizes) + \
        f"{'growth':>14}"
    lines.append(head)
    for ph in PHASES:
        vals = [getattr(runs[n], kind).get(ph, 0.0) / (n / 1000) for n in sizes]
        g = vals[-1] / vals[0] if vals[0] > 0 else float("nan")
        flag = g > GROWTH_LIMIT and vals[-1] > 0.005  # below 5 ms per 1k: noise
        if flag:
            flagged.append(ph.strip())
        lines.append(f"{ph:<36}" + "".join(f"{v:>11.3f}" for v in vals) + f"{g:>13.2f}x" + (" <-- >20%" if flag else "")
                     + (f"   ({NOTES[ph]})" if ph in NOTES else ""))
    total = [sum(getattr(runs[n], kind).get(p, 0.0) for p in PHASES if not p.startswith(" ")) / (n / 1000)
             for n in sizes]
    lines.append(f"{'total (top-level phases)':<36}" + "".join(f"{v:>11.3f}" for v in total)
                 + f"{total[-1] / total[0]:>13.2f}x")
    return lines, flagged


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[5000, 10000, 20000])
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--shard-size", type=int, default=256, help="extract.shard_size (the default: 256)")
    ap.add_argument("--concurrency", type=int, default=4, help="extract.concurrency (the default: 4)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--resume-check", action="store_true",
                    help="also time a resumed extract over the finished directory (re-verifies every sample)")
    ap.add_argument("--profile", help="cProfile the phases whose name contains this and print the top calls")
    ap.add_argument("--serve", nargs=2, metavar=("STAGING", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(0, Path(args.serve[0]), Path(args.serve[1]))
    if not (TINY / "tokenizer.json").exists():
        raise SystemExit(f"{TINY} missing: run `make tiny` first")

    def say(*a):
        print(*a, flush=True)

    say(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    say(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} CPUs; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; hidden {args.hidden}, shard_size {args.shard_size}, "
        f"concurrency {args.concurrency}, answers 500-3,000 tokens")
    runs: dict[int, Timer] = {}
    top = Path(tempfile.mkdtemp(prefix="client-scale-", dir=args.workdir))
    from transformers import AutoTokenizer

    try:
        t0 = time.perf_counter()
        source = top / "all.jsonl"
        ds = write_dataset(source, max(args.samples), AutoTokenizer.from_pretrained(TINY))
        say(f"# data set: {max(args.samples):,} rows in {time.perf_counter() - t0:.0f} s ({ds['repeated_passage']} "
            f"answers with a repeated passage, {ds['copies']} copies of an earlier answer); smaller N: its first rows")
        for n in args.samples:
            t, info = one_size(n, source, top / str(n), args.hidden, args.shard_size, args.concurrency, args.profile,
                               log=lambda *a: None, resume_check=args.resume_check)
            shutil.rmtree(top / str(n), ignore_errors=True)
            runs[n] = t
            say(f"# N={n:,}: {json.dumps(info)}; load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            for name, text in t.profiles.items():
                say(f"# profile of {name!r} at N={n:,}:\n" + "\n".join("#   " + x for x in text.splitlines()[:60]))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    sizes = sorted(runs)
    flagged = {}
    for kind in ("wall", "cpu"):
        lines, flagged[kind] = table(sizes, runs, kind)
        say("")
        say("\n".join(lines))
    say("")
    say(f"phases whose per-1k cost grows > 20 % from N={sizes[0]:,} to N={sizes[-1]:,}: wall "
        f"{flagged['wall'] or 'none'}; client CPU {flagged['cpu'] or 'none'}")


if __name__ == "__main__":
    main()
