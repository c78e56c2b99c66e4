"""The offline chain evaluator's counting, on hand-made cases."""

import torch

from eaglebox.draft.offline import chain_accept, per_position, simulate, summarize


def test_chain_accept_all_none_first_miss():
    assert chain_accept([5, 6, 7], [5, 6, 7]) == 3
    assert chain_accept([9, 6, 7], [5, 6, 7]) == 0
    assert chain_accept([5, 9, 7], [5, 6, 7]) == 1
    assert chain_accept([5, 6], [5]) == 1  # past the end of the continuation


class OracleDraft:
    """Proposes the continuation itself, except at positions listed in ``wrong`` (token -1)."""

    def __init__(self, seq, wrong=()):
        self.seq, self.wrong = seq, set(wrong)
        self.attn = self
        self.calls = []

    def reset(self):
        pass

    def truncate(self, n):
        self.calls.append(("truncate", n))

    def forward(self, tokens, hidden, positions):
        # the draft at position p predicts seq[p + 2]
        preds = [(0 if p + 2 in self.wrong or p + 2 >= len(self.seq) else int(self.seq[p + 2])) for p in positions.tolist()]
        return torch.nn.functional.one_hot(torch.tensor(preds), 256).float(), torch.zeros(len(positions), 1)

    def to_target_ids(self, x):
        return x


def run(seq_len, prompt_len, steps, wrong=()):
    seq = torch.arange(100, 100 + seq_len)
    return simulate(OracleDraft(seq, wrong), seq, torch.zeros(seq_len, 3), prompt_len, steps)


def test_perfect_draft_accepts_every_token_and_al_is_steps_plus_one():
    r = run(prompt_len=4, seq_len=4 + 17, steps=3)  # 17 new tokens: 1 from prefill + 4 cycles of 4
    assert r["accepted"] == [3, 3, 3, 3] and r["verify_ct"] == 4
    assert r["accept_length"] == 17 / 4


def test_first_miss_and_none_accepted():
    # the token at seq[6] is drafted wrong: cycle 1 accepts seq[5] only
    r = run(prompt_len=4, seq_len=4 + 9, steps=3, wrong={6})
    assert r["accepted"][0] == 1
    r = run(prompt_len=4, seq_len=4 + 5, steps=3, wrong=set(range(100)))
    assert r["accepted"] == [0, 0, 0, 0] and r["accept_length"] == 5 / 4


def test_per_position_rates_and_summary():
    assert per_position([3, 1, 0, 2], 3) == [0.75, 0.6667, 0.5]
    assert per_position([0, 0], 3) == [0.0, None, None]  # JSON null where no step reached the position
    s = summarize([{"completion_tokens": 10, "verify_ct": 4, "accept_length": 2.5, "accepted": [1, 2, 0, 3]}], 3, "0.5.23")
    assert s["accept_length"] == 2.5 and s["engine_version"] == "0.5.23" and s["accept_rate_per_position"][0] == 0.75
