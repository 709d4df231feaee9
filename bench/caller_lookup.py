"""What tying each request to its caller's process costs the fakes: requests per second to
the fake provider from a client process, with the caller lookup (chaos.fakes.peer) and
without, in the same run.

    python bench/caller_lookup.py [--requests 400] [--rounds 3]

The client opens a new connection per request, as urllib does (the lookup is made once per
connection), so this is the lookup's worst case; processes on the machine are counted,
since an unknown caller costs a walk over all of them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos.fakes import FakeProvider  # noqa: E402
from chaos.fakes.peer import PeerFinder  # noqa: E402

CLIENT = """
import http.client, json, sys, time
port, n, body = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
start = time.perf_counter()
for _ in range(n):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json"})
    conn.getresponse().read()
    conn.close()
print(n / (time.perf_counter() - start))
"""
BODY = json.dumps({"model": "m", "messages": [
    {"role": "system", "content": "step: verify\nAnswer with one JSON object."},
    {"role": "user", "content": json.dumps({"title": "t"})}]})


class _NoLookup(PeerFinder):
    def pid_of(self, client, server_port):
        return None


def rate(requests: int, lookup: bool) -> float:
    """Requests/s from a client process to a fresh fake provider."""
    with tempfile.TemporaryDirectory() as tmp, \
            FakeProvider(os.path.join(tmp, "ledger.jsonl")) as fake:
        if not lookup:
            fake.peers = _NoLookup()
        done = subprocess.run([sys.executable, "-c", CLIENT, str(fake.port), str(requests),
                               BODY], capture_output=True, text=True, timeout=600, check=True)
        entries = fake.entries()
        found = sum(e.get("caller_pid") is not None for e in entries)
        if lookup and found != len(entries):
            raise SystemExit(f"only {found} of {len(entries)} requests were tied to a process")
        return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    processes = sum(p.isdigit() for p in os.listdir("/proc"))
    print(f"caller lookup: {args.requests} requests x {args.rounds} rounds, a new connection "
          f"each, {processes} processes on the machine, load {os.getloadavg()[0]:.1f}")
    print(f"{'round':<7}{'with lookup/s':>15}{'without/s':>11}{'ratio':>7}")
    for i in range(1, args.rounds + 1):
        on, off = rate(args.requests, True), rate(args.requests, False)
        print(f"{i:<7}{on:>15.0f}{off:>11.0f}{on / off:>7.2f}")


if __name__ == "__main__":
    main()
