"""Offline acceptance: exact chain speculation (topk 1), as SGLang's greedy verification counts it.

For each held-out prompt the target's greedy continuation and its aux features for every position
come from the SGLang capture server (the engine that serves). The draft is SGLang's own
``LlamaForCausalLMEagle3`` (:mod:`eaglebox.draft.sglang_class`). Each cycle drafts ``num_steps``
tokens from the last verified position, accepts the longest prefix equal to the target's tokens,
and emits it plus the target's bonus token; AL = completion tokens / verify cycles, the number
SGLang reports as ``completion_tokens / spec_verify_ct``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglebox.draft.sglang_class import SGLangDraft


def chain_accept(draft: list[int], target: list[int]) -> int:
    """How many leading draft tokens equal the target's greedy tokens (greedy topk-1 verification)."""
    n = 0
    for d, t in zip(draft, target):
        if d != t:
            break
        n += 1
    return n


def simulate(draft, seq: torch.Tensor, feats: torch.Tensor, prompt_len: int, num_steps: int) -> dict:
    """One request. seq: prompt + greedy continuation ids; feats: [len(seq), k*H] target aux features.

    The prefill emits the first token; then each cycle extends the draft over the newly verified
    positions (target features, tokens shifted by one), drafts ``num_steps`` tokens and verifies.
    """
    total = len(seq)
    completion = total - prompt_len
    verified, extended, emitted = prompt_len, 0, 1
    accepted: list[int] = []
    draft.reset()
    while emitted < completion:
        draft.attn.truncate(extended)  # drop last cycle's draft-step keys
        positions = torch.arange(extended, verified)
        logits, h = draft.forward(seq[extended + 1 : verified + 1], feats[extended:verified], positions)
        tokens = [int(draft.to_target_ids(logits[-1].argmax()))]
        h = h[-1:]
        for j in range(1, num_steps):
            logits, h = draft.forward(torch.tensor([tokens[-1]]), h, torch.tensor([verified - 1 + j]))
            tokens.append(int(draft.to_target_ids(logits[-1].argmax())))
        target = seq[verified + 1 : verified + 1 + num_steps].tolist()
        a = chain_accept(tokens, target)
        accepted.append(a)
        extended = verified
        verified += a + 1
        emitted += a + 1
    cycles = len(accepted)
    return {"completion_tokens": completion, "verify_ct": cycles,
            "accept_length": completion / cycles if cycles else float("nan"), "accepted": accepted}


def per_position(accepted: list[int], num_steps: int) -> list[float | None]:
    """P(draft token k accepted | tokens before it accepted), k = 1..num_steps, to 4 places; None
    where no verify step reached position k (JSON null, not NaN, which JSON does not have)."""
    out = []
    for k in range(1, num_steps + 1):
        reached = sum(a >= k - 1 for a in accepted)
        out.append(round(sum(a >= k for a in accepted) / reached, 4) if reached else None)
    return out


def summarize(requests: list[dict], num_steps: int, engine_version: str) -> dict:
    accepted = [a for r in requests for a in r["accepted"]]
    completion = sum(r["completion_tokens"] for r in requests)
    cycles = sum(r["verify_ct"] for r in requests)
    return {"engine": "sglang", "engine_version": engine_version, "mode": "offline-chain", "num_steps": num_steps,
            "eagle_topk": 1, "requests": len(requests), "completion_tokens": completion, "verify_ct": cycles,
            "accept_length": completion / cycles if cycles else float("nan"),
            "accept_length_per_request": [round(r["accept_length"], 4) for r in requests],
            "accept_rate_per_position": per_position(accepted, num_steps)}


def evaluate_draft(draft_dir: Path, embed: torch.Tensor, samples, num_steps: int, engine_version: str,
                   device: str | torch.device = "cpu") -> dict:
    """The exported draft in ``draft_dir``, with the target's embedding, over ``samples``
    [(seq, aux features, prompt_len)]: the summary of :func:`simulate` over each. ``device``: where
    SGLang's draft class runs (a GPU trainer's own: a wide draft's one-token chain steps are slow on a CPU)."""
    draft = SGLangDraft(draft_dir, device=device)
    draft.set_embed(embed)
    return summarize([simulate(draft, seq, feats, n, num_steps) for seq, feats, n in samples], num_steps,
                     engine_version)
