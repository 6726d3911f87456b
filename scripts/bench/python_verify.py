"""Times the official openai SDK's webhook path on the deliveries `make bench` signs.

For each delivery: ``client.webhooks.verify_signature(body, headers)`` then
``json.loads(body)``, the same work as our verify + parse. The deliveries come from
``sandbox-bench deliveries`` (signed at "now", as the SDK refuses timestamps older than
300 s). Several rounds over all deliveries; the per-delivery time of each round is the
round's wall time over the count, and the median round is reported.

Usage: python_verify.py DELIVERIES.json --out python.json [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import openai


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("deliveries")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    with open(args.deliveries, "rb") as f:
        doc = json.load(f)
    client = openai.OpenAI(api_key="sk-bench-unused", webhook_secret=doc["secret"])
    timestamp = str(doc["timestamp"])
    prepared = [
        (
            d["body"].encode(),
            {
                "content-type": "application/json",
                "webhook-id": d["webhook_id"],
                "webhook-timestamp": timestamp,
                "webhook-signature": d["signature"],
            },
        )
        for d in doc["deliveries"]
    ]
    verify = client.webhooks.verify_signature
    loads = json.loads

    # Warm-up round, and a check that every delivery verifies and parses.
    for body, headers in prepared:
        verify(body, headers)
        assert loads(body)["type"] == "agent.session.action_required"

    per_delivery_ns = []
    for _ in range(args.rounds):
        start = time.perf_counter_ns()
        for body, headers in prepared:
            verify(body, headers)
            loads(body)
        per_delivery_ns.append((time.perf_counter_ns() - start) / len(prepared))

    result = {
        "per_delivery_ns": statistics.median(per_delivery_ns),
        "min_round_ns": min(per_delivery_ns),
        "max_round_ns": max(per_delivery_ns),
        "rounds": args.rounds,
        "deliveries": len(prepared),
        "body_bytes": len(prepared[0][0]) if prepared else 0,
        "openai": openai.__version__,
        "python": platform.python_version(),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(
        f"python sdk: {result['per_delivery_ns'] / 1e3:.2f} µs per delivery "
        f"(openai {openai.__version__}, Python {result['python']})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
