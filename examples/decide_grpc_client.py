#!/usr/bin/env python3
"""Ask a ratemesh node's decision API over gRPC whether a request may go on (grpcio, with
stubs that grpcio-tools compiles from docs/decide.proto at start). The node file needs an
`[admin]` table with `grpc_listen` and a token file (docs/node.md, "The decision API").

    python3 -m pip install grpcio grpcio-tools
    RATEMESH_TOKEN=... python3 examples/decide_grpc_client.py --addr 127.0.0.1:8091 \\
        per_account header:x-account=alice [--cost 3] [--jwt '{"sub": "alice"}']

prints one line per decision, as examples/decide_client.py does: `allowed 2/3 left, reset
in 3600000 ms` or `denied, retry in 1200 ms`, and exits 0 when allowed, 1 when denied, 2 on
an error (the gRPC status on standard error). `--check` only says whether grpcio and
grpcio-tools are installed.
"""

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, os.pardir, "docs", "decide.proto")


def stubs(proto):
    """Compile `proto` into a temporary folder; return its modules (messages, service)."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="ratemesh-stubs-")
    folder, name = os.path.split(os.path.abspath(proto))
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{folder}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            os.path.join(folder, name),
        ]
    )
    if status != 0:
        raise SystemExit(f"protoc could not compile {proto}")
    sys.path.insert(0, out)
    try:
        import decide_pb2
        import decide_pb2_grpc
    finally:
        sys.path.remove(out)
        shutil.rmtree(out, ignore_errors=True)
    return decide_pb2, decide_pb2_grpc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", help="the node's [admin] grpc_listen address")
    parser.add_argument("--proto", default=PROTO, help="the path of decide.proto")
    parser.add_argument("--cost", type=int, help="tokens to take (default 1; 0 only looks)")
    parser.add_argument("--jwt", default="", help="the claims, a JSON object")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("policy", nargs="?")
    parser.add_argument("attributes", nargs="*", help="NAME=VALUE, e.g. api_key=… or header:x-account=…")
    args = parser.parse_args()
    try:
        import grpc
        import grpc_tools  # noqa: F401
    except ImportError as error:
        print(f"missing: {error}", file=sys.stderr)
        return 3
    if args.check:
        print("grpcio", grpc.__version__)
        return 0
    if not args.addr or not args.policy:
        parser.error("give --addr and a policy")
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
    messages, service = stubs(args.proto)
    check = messages.Check(policy=args.policy, attributes=attributes, jwt_claims_json=args.jwt)
    if args.cost is not None:
        check.cost = args.cost
    with grpc.insecure_channel(args.addr) as channel:
        stub = service.DecideStub(channel)
        try:
            response = stub.Decide(
                messages.DecideRequest(checks=[check]),
                metadata=[("authorization", "Bearer " + token)],
                timeout=5.0,
            )
        except grpc.RpcError as error:
            print(f"{error.code().name}: {error.details()}", file=sys.stderr)
            return 2
    status = 0
    for result in response.results:
        if result.error:
            print(f"{result.error}: {result.message}")
            status = 2
        elif result.allowed:
            print(f"allowed {result.remaining}/{result.limit} left, reset in {result.reset_after_ms} ms")
        else:
            print(f"denied, retry in {result.retry_after_ms} ms")
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
