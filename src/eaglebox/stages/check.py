"""``eaglebox check``: the consistency gate; exits non-zero with the numbers when it fails."""

import json


def run(cfg) -> int:
    from eaglebox.bench.gate import run_gate

    r = run_gate(cfg)
    t, c = r["trained"], r["random_control"]
    print(json.dumps({"trained_accept_length": t["accept_length"], "random_accept_length": c["accept_length"],
                      "accept_rate_per_position": t["accept_rate_per_position"], "sglang": t["engine_version"],
                      "timings": r["timings"], "passed": r["passed"]}, indent=1))
    if not r["passed"]:
        print(f"check FAILED: trained AL {t['accept_length']:.3f} (need >= {r['min_accept_length']}), "
              f"random-weights AL {c['accept_length']:.3f} (need <= {r['random_control_max_accept_length']})")
        return 1
    return 0
