#!/usr/bin/env python3
"""Ask a ratemesh node's decision API whether a request may go on (Python's standard
library only). The node file needs an `[admin]` port and a token file (docs/node.md,
"The decision API").

    RATEMESH_TOKEN=... python3 examples/decide_client.py --url http://127.0.0.1:8090 \\
        per_account header:x-account=alice [--cost 3]

prints one line per decision: `allowed 2/3 left, reset in 3600000 ms` or `denied, retry
in 1200 ms`, and exits 0 when every request was allowed, 1 when one was denied, 2 on an
error. `--json` prints the node's answer as it is.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request


def decide(url, token, requests, timeout=5.0):
    """POST `requests` ([{"policy", "attributes", "cost"}]) to the node; return its answers."""
    body = json.dumps({"requests": requests}).encode()
    call = urllib.request.Request(
        url.rstrip("/") + "/v1/decide",
        data=body,
        method="POST",
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(call, timeout=timeout) as answer:
        return json.load(answer)["responses"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the node's [admin] address")
    parser.add_argument("--cost", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("policy")
    parser.add_argument("attributes", nargs="*", help="NAME=VALUE, e.g. api_key=… or header:x-account=…")
    args = parser.parse_args()
    token = os.environ.get("RATEMESH_TOKEN")
    if not token:
        print("set RATEMESH_TOKEN to a token of the node's admin token file", file=sys.stderr)
        return 2
    attributes = {}
    for pair in args.attributes:
        name, sep, value = pair.partition("=")
        if not sep:
            print(f"{pair}: write NAME=VALUE", file=sys.stderr)
            return 2
        attributes[name] = value
    try:
        answers = decide(args.url, token, [{"policy": args.policy, "attributes": attributes, "cost": args.cost}])
    except urllib.error.HTTPError as error:
        print(f"{error.code}: {error.read().decode(errors='replace')}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"{args.url}: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(answers))
    status = 0
    for answer in answers:
        if "error" in answer:
            print(f"{answer['error']}: {answer['message']}")
            status = 2
        elif answer["allowed"]:
            if not args.json:
                print(f"allowed {answer['remaining']}/{answer['limit']} left, reset in {answer['reset_after_ms']} ms")
        else:
            if not args.json:
                print(f"denied, retry in {answer['retry_after_ms']} ms")
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
