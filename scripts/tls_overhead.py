"""What TLS + mutual TLS + the bearer token cost on the served tiny stack: the same greedy requests through
a plaintext stack and a secured one, alternating, then the median and p90 latency of each.

.venv/bin/python scripts/tls_overhead.py --requests 60    (figures: docs/reliability.md, Security)"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specserve.certs import make_certs  # noqa: E402
from specserve.security import TLSConfig  # noqa: E402
from specserve_client import SpecServeClient  # noqa: E402
from tests.stack import LocalStack  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    key = "overhead-check"
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certs(tmp)
        with LocalStack() as plain, LocalStack(certs=certs, api_key=key) as secured:
            clients = {
                "plaintext": SpecServeClient(plain.address, 60),
                "tls+mtls+key": SpecServeClient(secured.address, 60, tls=TLSConfig.from_dir(certs, "client"),
                                                api_key=key),  # fmt: skip
            }
            seconds: dict[str, list[float]] = {name: [] for name in clients}
            for i in range(args.requests + 5):  # 5 warm-up rounds, not counted
                for name, client in clients.items():
                    started = time.perf_counter()
                    response = client.generate("def f(", max_tokens=args.max_tokens, num_speculative_tokens=4,
                                               ignore_eos=True)  # fmt: skip
                    assert len(response.token_ids) == args.max_tokens
                    if i >= 5:
                        seconds[name].append(time.perf_counter() - started)
            for client in clients.values():
                client.close()
    print(f"{args.requests} requests x {args.max_tokens} tokens, k=4, tiny models, alternating")
    for name, values in seconds.items():
        values.sort()
        p90 = values[int(0.9 * (len(values) - 1))]
        print(f"{name:14} median {1000 * statistics.median(values):7.1f} ms   p90 {1000 * p90:7.1f} ms")


if __name__ == "__main__":
    main()
