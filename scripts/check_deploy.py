#!/usr/bin/env python3
"""Checks deploy/: every Kubernetes manifest parses as YAML and has the objects and fields the Redis-queue
deployment needs (docs/deploy.md); the Dockerfile has a multi-stage build on a CUDA base and the
instructions the image relies on. Exit 0 = fine, 1 = a problem (printed), 77 = skipped (no PyYAML)."""
import pathlib
import re
import sys

try:
    import yaml
except ImportError:
    print("skipped: PyYAML not installed (Debian package python3-yaml)")
    sys.exit(77)

problems = []


def need(cond, what):
    if not cond:
        problems.append(what)


def containers(obj):
    return obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])


def check_k8s(folder):
    objects = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        except yaml.YAMLError as e:
            problems.append(f"{path.name}: not valid YAML: {e}")
            continue
        for d in docs:
            need(isinstance(d, dict) and "apiVersion" in d and "kind" in d and "name" in d.get("metadata", {}),
                 f"{path.name}: every object needs apiVersion, kind and metadata.name")
            objects.append((path.name, d))
    by_kind = {}
    for name, d in objects:
        by_kind.setdefault(d.get("kind"), []).append(d)
    deployments = {d["metadata"]["name"]: d for d in by_kind.get("Deployment", [])}
    need("atelier-gateway" in deployments, "a Deployment atelier-gateway")
    need("atelier-worker" in deployments, "a Deployment atelier-worker")
    for name, d in deployments.items():
        sel = d["spec"]["selector"]["matchLabels"]
        labels = d["spec"]["template"]["metadata"]["labels"]
        need(all(labels.get(k) == v for k, v in sel.items()), f"{name}: the selector matches the pod labels")
        for c in containers(d):
            args = c.get("args", [])
            need("--queue" in args, f"{name}: the container passes --queue")
    if "atelier-gateway" in deployments:
        args = containers(deployments["atelier-gateway"])[0].get("args", [])
        need(args[:1] == ["serve"], "gateway runs `atelier serve`")
    if "atelier-worker" in deployments:
        c = containers(deployments["atelier-worker"])[0]
        need(c.get("args", [])[:1] == ["worker"], "worker runs `atelier worker`")
        need("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}), "worker requests nvidia.com/gpu")
    services = [d["metadata"]["name"] for d in by_kind.get("Service", [])]
    need("atelier" in services and "redis" in services, "Services atelier and redis")
    sets = by_kind.get("StatefulSet", [])
    need(len(sets) == 1, "one StatefulSet (redis)")
    if sets:
        r = sets[0]
        args = containers(r)[0].get("args", [])
        need("--appendonly" in args and args[args.index("--appendonly") + 1] == "yes", "redis runs with --appendonly yes")
        need(r["spec"].get("volumeClaimTemplates"), "redis keeps its data on a PersistentVolumeClaim")


def check_dockerfile(path):
    text = path.read_text()
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    known = {"FROM", "RUN", "COPY", "ARG", "ENV", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "HEALTHCHECK", "LABEL"}
    joined = []
    for l in lines:  # continuation lines belong to the instruction before
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + l
        else:
            joined.append(l)
    for l in joined:
        word = l.split()[0].upper()
        need(word in known, f"Dockerfile: unknown instruction {word}")
    froms = [l for l in joined if l.upper().startswith("FROM ")]
    need(len(froms) >= 2, "Dockerfile: a multi-stage build (two FROM)")
    need(any(re.search(r"nvidia/cuda:\S*runtime", l) for l in froms), "Dockerfile: the final stage on an nvidia/cuda runtime image")
    need(any("COPY --from=" in l for l in joined), "Dockerfile: the binary copied from the build stage")
    need(any(l.upper().startswith("ENTRYPOINT") for l in joined), "Dockerfile: an ENTRYPOINT")
    need("libhiredis" in text, "Dockerfile: hiredis installed (build stage)")
    need(any(l.upper().startswith("USER") for l in joined), "Dockerfile: runs as a non-root USER")


root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "deploy")
check_k8s(root / "k8s")
check_dockerfile(root / "Dockerfile")
for p in problems:
    print("deploy check:", p)
print("deploy check:", "ok" if not problems else f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
