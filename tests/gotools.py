"""The command-line tools the deployment tests run, pinned, and installed by the tests themselves.

kustomize (renders ``deploy/kubernetes``), kubeconform (validates what it renders against the Kubernetes API's
schemas) and promtool (Prometheus's own rule checker and rule tester) are built from source with
``go install MODULE/CMD@VERSION``, through the Go module proxy (go.sum's checksum database checks every module).
The schemas are those of the ``kubernetes-validate`` wheel on PyPI (JSON schemas of every kind, for each
Kubernetes minor version), fetched by pip with its hash pinned, never installed: kubeconform reads them as files.

Everything lands in ``.tools/`` at the repository root, in a directory named after the version, so the first run
builds (about a minute with Go's caches cold) and later runs reuse it; a bumped version installs beside the old
one. A missing ``go``, or a build or download that fails, raises :class:`ToolInstallError` with the command and
its output: the test that needed the tool fails, it is never skipped. ``python -m tests.gotools`` installs them
all (``make tools``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".tools"

# name -> (package to `go install`, version). promtool's module versions are Prometheus's: v0.316.0 is 3.16.0.
GO_TOOLS: dict[str, tuple[str, str]] = {
    "kustomize": ("sigs.k8s.io/kustomize/kustomize/v5", "v5.8.2"),
    "kubeconform": ("github.com/yannh/kubeconform/cmd/kubeconform", "v0.8.0"),
    "promtool": ("github.com/prometheus/prometheus/cmd/promtool", "v0.316.0"),
}

# The Kubernetes JSON schemas: the wheel, its hash (pip refuses any other file), and the versions checked.
SCHEMAS_WHEEL = "kubernetes-validate==1.37.0"
SCHEMAS_WHEEL_SHA256 = "85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9"
KUBERNETES_VERSIONS = ("1.33.0", "1.36.0")
# kubeconform's own layout: one directory per version, one file per kind and API version.
SCHEMA_LOCATION_TEMPLATE = "{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/" \
                           "{{ .ResourceKind }}{{ .KindSuffix }}.json"


class ToolInstallError(RuntimeError):
    """A tool could not be installed: the message has the command and what it printed."""


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One installer at a time (several test processes may start at once)."""
    TOOLS.mkdir(exist_ok=True)
    with (TOOLS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolInstallError(f"{' '.join(command)}: {exc}") from exc
    if done.returncode != 0:
        raise ToolInstallError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}")


def go_tool(name: str) -> Path:
    """The path of the pinned ``name`` (a key of :data:`GO_TOOLS`), built with ``go install`` if not yet."""
    package, version = GO_TOOLS[name]
    binary = TOOLS / f"{name}-{version}" / name
    if binary.is_file():
        return binary
    go = shutil.which("go")
    if go is None:
        raise ToolInstallError(f"`go` is not on PATH: it builds {name} ({package}@{version}); install Go "
                               "(https://go.dev/doc/install) and run again")
    with _locked():
        if not binary.is_file():
            staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=TOOLS))
            try:
                _run([go, "install", f"{package}@{version}"],
                     env={**os.environ, "GOBIN": str(staging), "GOFLAGS": "-buildvcs=false"})
                shutil.rmtree(binary.parent, ignore_errors=True)  # what an interrupted install left
                staging.rename(binary.parent)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return binary


def _relocated(node: Any) -> Any:
    """The wheel's schemas refer to their definitions by an absolute id (``/api/_definitions.json#...``) that its
    own validator maps to the file; as files side by side, the same reference is relative."""
    if isinstance(node, dict):
        return {key: (value.replace("/api/_definitions.json#", "_definitions.json#")
                      if key == "$ref" and isinstance(value, str) else _relocated(value))
                for key, value in node.items() if key != "$id"}
    if isinstance(node, list):
        return [_relocated(item) for item in node]
    return node


def kubernetes_schemas() -> Path:
    """A directory of kubeconform-layout strict JSON schemas for every version in :data:`KUBERNETES_VERSIONS`
    (use it with :data:`SCHEMA_LOCATION_TEMPLATE`)."""
    name, version = SCHEMAS_WHEEL.split("==")
    target = TOOLS / f"kubernetes-json-schema-{version}"
    if all((target / f"v{k}-standalone-strict" / "_definitions.json").is_file() for k in KUBERNETES_VERSIONS):
        return target
    with _locked():
        downloads = TOOLS / "downloads"
        requirements = TOOLS / "schemas-requirements.txt"
        requirements.write_text(f"{SCHEMAS_WHEEL} --hash=sha256:{SCHEMAS_WHEEL_SHA256}\n")
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
              "--require-hashes", "--dest", str(downloads), "--requirement", str(requirements)])
        (wheel,) = downloads.glob(f"{name.replace('-', '_')}-{version}-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for kubernetes in KUBERNETES_VERSIONS:
                prefix = f"kubernetes_validate/kubernetes-json-schema/v{kubernetes}-local-strict/"
                members = [m for m in archive.namelist() if m.startswith(prefix) and m.endswith(".json")]
                if not members:
                    raise ToolInstallError(f"{wheel.name} has no schemas for Kubernetes {kubernetes}")
                staging = Path(tempfile.mkdtemp(prefix=".schemas-", dir=TOOLS))
                for member in members:
                    schema = _relocated(json.loads(archive.read(member)))
                    (staging / member.removeprefix(prefix)).write_text(json.dumps(schema))
                final = target / f"v{kubernetes}-standalone-strict"
                shutil.rmtree(final, ignore_errors=True)
                final.parent.mkdir(parents=True, exist_ok=True)
                staging.rename(final)
    return target


def install_all() -> None:
    for name in GO_TOOLS:
        print(f"{name}: {go_tool(name)}")
    print(f"Kubernetes schemas: {kubernetes_schemas()}")


if __name__ == "__main__":
    try:
        install_all()
    except ToolInstallError as exc:
        sys.exit(f"tools: {exc}")
