"""``eaglebox parity``: compare the shards with an HF fp32 forward; non-zero exit when a layer mismatches."""

import json


def run(cfg) -> int:
    from eaglebox.bench.parity import parity_report

    report = parity_report(cfg.extract.output_dir, cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1
