"""The served speed-up, side by side: the target alone and target + draft servers alive together,
measured in alternating rounds.

Why this shape: a GPU's clocks, a neighbour's load and SGLang's warm-up drift over minutes, so the
target and every speculative server are measured one after the other within each round, and each
speed-up is reported as the median and the worst round's ratio. Speculative decoding must not change
greedy output: every speculative output is diffed token by token against the target's (same prompts,
concurrency and round), and each first difference gets the target's top-2 logprob gap there, which
tells a near-tie (bf16 rounding between batch shapes) from a bug. The random-weights control draft,
served like the trained one, shows what training bought.

The report (``bench.json``) is rewritten after every measurement, so a run cut short keeps what it made.
"""

from __future__ import annotations

import json
import statistics
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import requests

from eaglebox.bench.served import acceptance, plot_bench, run_prompts
from eaglebox.config.schema import Chain, EngineConfig
from eaglebox.engine.launch import server_for
from eaglebox.engine.server import SGLangServer, free_port
from eaglebox.shards.spec import engine_version

WARMUP_TOKENS = 16
"""Warm-up request length: the first requests compile SGLang's JIT and Triton kernels, kept out of rounds.
The bench warms up every server it measures (the target at ``bench.target_url`` too), so the servers it
starts skip SGLang's own warm-up request (``--skip-server-warmup``): the same work twice, 6-9 s of a
speculative server's start on a CPU under Triton's interpreter (docs/testing.md)."""


@dataclass(frozen=True)
class Variant:
    """One speculative server: a draft (the trained one or the control) at one chain setting."""
    draft: str  # "trained" | "control"
    path: Path
    chain: Chain

    @property
    def name(self) -> str:
        return f"{self.draft} {self.chain.label()}"


def chains(cfg) -> list[Chain]:
    s = cfg.serve
    return cfg.bench.chains or [Chain(num_steps=s.num_steps, eagle_topk=s.eagle_topk,
                                      num_draft_tokens=s.num_draft_tokens)]


def variants(cfg, control: Path | None) -> list[Variant]:
    """The trained draft at every chain; the control at the first chain, right after it."""
    cs = chains(cfg)
    out = [Variant("trained", cfg.serve.draft_path, cs[0])]
    if control is not None:
        out.append(Variant("control", control, cs[0]))
    return out + [Variant("trained", cfg.serve.draft_path, c) for c in cs[1:]]


def server_cfg(cfg, port: int, variant: Variant | None):
    """``cfg`` with its own port, and the variant's draft and chain (None: the target alone)."""
    serve = cfg.serve.model_copy(update={"draft_path": None} if variant is None else {
        "draft_path": variant.path, "num_steps": variant.chain.num_steps, "eagle_topk": variant.chain.eagle_topk,
        "num_draft_tokens": variant.chain.num_draft_tokens})
    return cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"port": port}), "serve": serve})


def requests_at(prompts: list[list[int]], concurrency: int, min_requests: int | None) -> list[list[int]]:
    return prompts if min_requests is None else prompts[:max(concurrency, min_requests)]


def differences(spec_out: list[list[int]], ref_out: list[list[int]]) -> list[dict]:
    """Per differing request: where the outputs first part and how many tokens differ."""
    diffs = []
    for i, (a, b) in enumerate(zip(spec_out, ref_out)):
        if a != b:
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append({"prompt": i, "first_diff_at": k, "spec_len": len(a), "target_len": len(b),
                          "differing_tokens": sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))})
    return diffs


def top2_gap(url: str, ids: list[int]) -> dict:
    """The target's top-2 logprobs for the token after ``ids``: a small gap is a near-tie."""
    r = requests.post(url + "/generate", json={"input_ids": ids, "return_logprob": True, "top_logprobs_num": 2,
                                               "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
                      timeout=300)
    r.raise_for_status()
    top = r.json()["meta_info"]["output_top_logprobs"][0]
    return {"top2": [[round(t[0], 5), t[1]] for t in top], "gap": round(top[0][0] - top[1][0], 5)}


class Bench:
    """One side-by-side run; ``report`` is ``bench.json``'s content."""

    def __init__(self, cfg, prompts: list[list[int]], out_dir: Path, control: Path | None, log=print):
        self.cfg, self.prompts, self.out_dir, self.log = cfg, prompts, Path(out_dir), log
        self.variants = variants(cfg, control)
        b = cfg.bench
        self.outputs: dict[tuple[str, int, int], list[list[int]]] = {}
        self.report = {"engine": "sglang", "engine_version": engine_version(), "device": device_name(cfg.engine),
                       "target": str(cfg.model.path), "draft": str(cfg.serve.draft_path), "prompts": len(prompts),
                       "max_new_tokens": b.max_new_tokens, "temperature": 0, "concurrency": b.concurrency,
                       "rounds": b.rounds, "requests": {c: len(requests_at(prompts, c, b.min_requests))
                                                        for c in b.concurrency},
                       "variants": [v.name for v in self.variants], "startup_s": {}, "runs": [], "equality": [],
                       "first_difference_top2": []}

    def save(self) -> None:
        """Rewritten after every measurement, with the summary of what is measured so far: a bench cut
        short (a device taken back, a budget spent) still reads as one."""
        self.report["summary"] = summarize(self.report)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.out_dir / "bench.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=1) + "\n")
        tmp.replace(self.out_dir / "bench.json")

    def start(self, stack: ExitStack, name: str, variant: Variant | None) -> SGLangServer:
        srv = server_for(server_cfg(self.cfg, free_port(), variant), "plain" if variant is None else "speculative",
                         self.out_dir / f"server-{name.replace(' ', '-').replace('/', '_')}.log", warmup=False)
        stack.callback(srv.stop)
        srv.launch()
        return srv

    def measure(self, name: str, url: str, c: int, rnd: int, num_steps: int | None = None) -> None:
        """One request set at concurrency ``c``; ``num_steps`` (a speculative server's) adds its AL."""
        b = self.cfg.bench
        r = run_prompts(url, requests_at(self.prompts, c, b.min_requests), b.max_new_tokens, c)
        row = {"server": name, "round": rnd, "concurrency": c, "wall_s": r["wall_s"],
               "completion_tokens": r["completion_tokens"], "tokens_per_s": r["tokens_per_s"]}
        if num_steps is not None:
            a = acceptance(r["meta"], num_steps)
            row |= {k: a[k] for k in ("accept_length", "verify_ct", "accept_rate_per_position",
                                      "accept_length_per_request")}
            self.report.setdefault("acceptance", a)  # the headline: the first speculative measurement
        self.report["runs"].append(row)
        self.outputs[(name, c, rnd)] = r["outputs"]
        self.log(f"bench: round {rnd} c={c} {name}: {r['tokens_per_s']} tok/s in {r['wall_s']:.1f} s"
                 + (f", AL {row['accept_length']:.3f}" if row.get("accept_length") else ""))
        self.save()

    def batch(self, target_url: str, group: list[Variant], target: SGLangServer | None = None) -> None:
        """Starts ``group``'s servers beside the target, warms them up, runs the rounds. ``target``: the
        bench's own target server, launched and not yet healthy (the first batch): waited for once this
        batch's servers are launched too, so that they start side by side."""
        b = self.cfg.bench
        with ExitStack() as stack:
            servers = {v.name: self.start(stack, v.name, v) for v in group}
            if target is not None:
                self.wait_target(target)
            for name, srv in servers.items():
                srv.wait()
                self.report["startup_s"][name] = round(srv.startup_s, 1)
                self.log(f"bench: {name} server healthy after {srv.startup_s:.0f} s")
            steps = {"target": None} | {v.name: v.chain.num_steps for v in group}
            urls = {"target": target_url} | {n: s.url for n, s in servers.items()}
            for url in urls.values():
                for c in b.concurrency:
                    run_prompts(url, self.prompts[:c], WARMUP_TOKENS, c)
            for rnd in range(1, b.rounds + 1):
                for c in b.concurrency:
                    for name, url in urls.items():
                        self.measure(name, url, c, rnd, steps[name])
                self.compare(target_url, group, rnd)

    def compare(self, target_url: str, group: list[Variant], rnd: int) -> None:
        """Each variant's round-``rnd`` outputs against the target's of the same round and concurrency."""
        for v in group:
            for c in self.cfg.bench.concurrency:
                spec, ref = self.outputs.get((v.name, c, rnd)), self.outputs.get(("target", c, rnd))
                if spec is None or ref is None:
                    continue
                diffs = differences(spec, ref)
                self.report["equality"].append({
                    "server": v.name, "concurrency": c, "round": rnd, "requests_differing": len(diffs),
                    "differing_tokens": sum(d["differing_tokens"] for d in diffs), "diffs": diffs[:8]})
                for d in diffs[:2]:  # the first two a measurement: enough to tell near-ties from a bug
                    ids = self.prompts[d["prompt"]] + spec[d["prompt"]][: d["first_diff_at"]]
                    self.report["first_difference_top2"].append(
                        {"server": v.name, "concurrency": c, "round": rnd, "prompt": d["prompt"],
                         "at": d["first_diff_at"], **top2_gap(target_url, ids)})
        self.save()

    def run(self) -> dict:
        """``bench.url``: the running server at each concurrency; else the side-by-side rounds."""
        b = self.cfg.bench
        if b.url:
            self.report |= {"server": b.url, "variants": ["served"], "rounds": 1}
            for c in b.concurrency:
                self.measure("served", b.url.rstrip("/"), c, 1, self.cfg.serve.num_steps)
        else:
            self.side_by_side()
        trained = [e for e in self.report["equality"] if e["server"].startswith("trained")]
        self.report["outputs_equal_target_greedy"] = (not any(e["differing_tokens"] for e in trained)
                                                      if trained else None)
        self.save()
        plot_bench(self.report, self.out_dir / "bench.png")
        return self.report

    def side_by_side(self) -> None:
        b = self.cfg.bench
        per = b.servers_at_once - 1
        with ExitStack() as stack:
            if b.target_url:
                target_url = self.report["target_server"] = b.target_url.rstrip("/")
                self.log(f"bench: the target alone at {target_url}")
                target = None
            else:  # launched here, waited for in the first batch, beside whose servers it starts
                target = self.start(stack, "target", None)
                target_url = target.url
            for i in range(0, len(self.variants), per):
                self.batch(target_url, self.variants[i:i + per], target if i == 0 else None)

    def wait_target(self, target: SGLangServer) -> None:
        target.wait()
        self.report["startup_s"]["target"] = round(target.startup_s, 1)
        self.log(f"bench: target server healthy after {target.startup_s:.0f} s")


def device_name(e: EngineConfig) -> str:
    if e.device != "cuda":
        return e.device
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda"


def summarize(report: dict) -> dict:
    """Per variant and concurrency: speed-up median and worst over rounds (each round's ratio to the
    target's tok/s of the same round and batch), AL median; then the best trained chain per concurrency."""
    runs = report["runs"]
    rows = []
    for name in report["variants"]:
        for c in report["concurrency"]:
            spec = [r for r in runs if r["server"] == name and r["concurrency"] == c]
            if not spec:
                continue
            ratios = []
            for r in spec:  # the target's run just before it in the same round
                before = [t for t in runs[: runs.index(r)] if t["server"] == "target" and t["concurrency"] == c
                          and t["round"] == r["round"]]
                if before:
                    ratios.append(round(r["tokens_per_s"] / before[-1]["tokens_per_s"], 3))
            rows.append({"variant": name, "concurrency": c, "rounds": len(ratios), "speedup_per_round": ratios,
                         "speedup_median": statistics.median(ratios) if ratios else None,
                         "speedup_worst": min(ratios) if ratios else None,
                         "accept_length_median": statistics.median(r["accept_length"] for r in spec),
                         "accept_rate_per_position": spec[-1]["accept_rate_per_position"],
                         "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in spec)})
    best = {}
    for c in report["concurrency"]:
        trained = [r for r in rows if r["concurrency"] == c and r["variant"].startswith("trained")
                   and r["speedup_median"] is not None]
        if trained:
            top = max(trained, key=lambda r: r["speedup_median"])
            best[c] = {"chain": top["variant"].split()[1], "speedup_median": top["speedup_median"],
                       "speedup_worst": top["speedup_worst"], "accept_length_median": top["accept_length_median"]}
    differing = sum(e["differing_tokens"] for e in report["equality"])
    gaps = [g["gap"] for g in report["first_difference_top2"] if "gap" in g]
    return {"per_variant": rows, "best_chain_per_concurrency": best, "differing_tokens": differing,
            "max_top2_gap_at_first_difference": max(gaps) if gaps else None}
