#!/usr/bin/env python3
"""Check deploy/docker/Dockerfile for the basics: every base image pinned to a version (or
a digest), the build stage on a Rust at least the crate's `rust-version` and building with
`--locked --profile dist`, the final stage running as a user other than root, a health
check, the `ratemesh` entrypoint, no secret in ENV or ARG, and a .dockerignore that keeps
keys and certificates out of the build context. Exit 1 with each problem found."""

import re
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
dockerfile = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "deploy/docker/Dockerfile"
text = dockerfile.read_text()
# Instructions, with continued lines joined and comments left out.
lines = [l for l in re.sub(r"\\\n\s*", " ", text).splitlines() if l.strip() and not l.lstrip().startswith("#")]
problems = []

stages = [l.split() for l in lines if l.upper().startswith("FROM ")]
if not stages:
    problems.append("no FROM")
for words in stages:
    image = words[1]
    if "@sha256:" in image:
        continue
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    if not re.match(r"^\d+(\.\d+)+", tag):
        problems.append(f"base image {image} is not pinned to a version or a digest")

rust_version = re.search(r'^rust-version = "([\d.]+)"', (root / "Cargo.toml").read_text(), re.M).group(1)
builders = [w[1] for w in stages if w[1].startswith("rust:")]
if not builders:
    problems.append("no build stage on a rust: image")
for image in builders:
    tag = re.match(r"rust:(\d+)\.(\d+)", image)
    wanted = tuple(int(p) for p in rust_version.split(".")[:2])
    if not tag or tuple(int(g) for g in tag.groups()) < wanted:
        problems.append(f"{image} is older than the crate's rust-version {rust_version}")
if not any("cargo build" in l and "--locked" in l and "--profile dist" in l for l in lines):
    problems.append("the build stage does not run `cargo build --locked --profile dist`")

final = lines[max(i for i, l in enumerate(lines) if l.upper().startswith("FROM ")):]
users = [l.split()[1] for l in final if l.upper().startswith("USER ")]
if not users or users[-1].split(":")[0] in ("root", "0"):
    problems.append("the final stage does not run as a user other than root (USER)")
if not any(l.upper().startswith("HEALTHCHECK ") and "/health" in l for l in final):
    problems.append("no HEALTHCHECK asking /health")
if not any(l.upper().startswith("ENTRYPOINT ") and "ratemesh" in l for l in final):
    problems.append("the entrypoint is not the ratemesh binary")
for l in lines:
    if re.match(r"(ENV|ARG)\s", l, re.I) and re.search(r"(SECRET|PASSWORD|TOKEN|PRIVATE|_KEY)\w*\s*=", l, re.I):
        problems.append(f"a secret in the image: {l.strip()}")
    if re.match(r"(COPY|ADD)\s", l, re.I) and re.search(r"\.(key|pem)\b", l):
        problems.append(f"keys or certificates copied into the image: {l.strip()}")

ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
ignored = ignore.read_text().split() if ignore.exists() else []
for pattern in ("**/*.key", "**/*.pem", "target", ".git"):
    if pattern not in ignored:
        problems.append(f"{ignore.name} does not leave out {pattern}")

for p in problems:
    print(f"{dockerfile}: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"{dockerfile}: pinned bases, builds with --locked --profile dist on Rust >= {rust_version}, "
      f"runs as {users[-1]}, health check, no secrets")
