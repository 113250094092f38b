"""Building the lab image, from a registry or offline from a wheelhouse: the Docker side of
``python -m lab image`` (:mod:`lab.tools.image` is the command: its flags, plan and words).

Offline means no network inside the build (``network_mode=none``): wheels for the *image's*
Python and platform (probed by running the base image) are fetched on the host with
``pip download`` into ``docker/wheelhouse/`` (git-ignored), and the Dockerfile installs them with
``--no-index --find-links``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from lab.engine.client import LabError

__all__ = [
    "EXTRAS_LABEL",
    "IMAGE_TOOLS",
    "REPO_ROOT",
    "TORCH_CPU_INDEX",
    "BasePlatform",
    "build_image",
    "download_wheels",
    "pip_download_command",
    "platform_tags",
    "probe_base",
    "requirements",
    "stage_etcd",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The image label naming the optional extras installed at build time ("torchft"), so a run
# that needs one can refuse an image without it before starting any container.
EXTRAS_LABEL = "lab.extras"
# Installed into every image beside the project, not dependencies of it: ``lab run`` reads a
# stuck rank's Python stack with py-spy (its wheel ships the binary), from outside the process.
IMAGE_TOOLS = ("py-spy",)
_PROBE = (
    "import json, platform, sys; "
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
    "'machine': platform.machine(), 'libc': platform.libc_ver()}))"
)


@dataclass(frozen=True)
class BasePlatform:
    """What a wheel must match to install in the base image."""

    python: str  # "3.11"
    machine: str  # "x86_64"
    glibc: tuple[int, int]  # (2, 36)


def probe_base(client: docker.DockerClient, base_image: str) -> BasePlatform:
    """Run the base image once (no network) and ask its python3 for version and platform."""
    try:
        client.images.get(base_image)
    except docker.errors.ImageNotFound:
        raise LabError(
            f"base image {base_image} is not on this machine and an offline build cannot pull "
            "it; `docker pull` it where a registry is reachable (or `docker load` a saved copy), "
            "or name a local image with python3 as --base-image"
        ) from None
    try:
        out = client.containers.run(
            base_image, ["python3", "-c", _PROBE], remove=True, network_disabled=True
        )
    except docker.errors.ContainerError as e:
        raise LabError(f"base image {base_image} has no working python3: {e}") from None
    info = json.loads(out.decode().strip().splitlines()[-1])
    lib, version = info["libc"]
    if lib != "glibc":
        raise LabError(
            f"base image {base_image} uses {lib or 'an unknown libc'}; the offline "
            "build needs a glibc (manylinux) image such as Debian or Ubuntu"
        )
    major, minor = (int(x) for x in version.split(".")[:2])
    return BasePlatform(python=info["python"], machine=info["machine"], glibc=(major, minor))


def platform_tags(base: BasePlatform) -> list[str]:
    """manylinux tags the base accepts, newest first (pip does not expand ``--platform``)."""
    major, minor = base.glibc
    assert major == 2, base.glibc
    tags = [f"manylinux_2_{m}_{base.machine}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{base.machine}" for m, name in legacy.items() if minor >= m]
    return tags


def requirements(root: Path = REPO_ROOT, extras: tuple[str, ...] = ()) -> list[str]:
    """The project's dependencies, those of ``extras`` (``[project.optional-dependencies]``),
    plus its build backend (the image builds the project)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise LabError(
            "--offline reads pyproject.toml with tomllib: run it with Python 3.11+"
        ) from None
    data = tomllib.loads((root / "pyproject.toml").read_text())
    optional = data["project"].get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise LabError(
            f"unknown extra {unknown[0]!r}: pyproject.toml offers {', '.join(sorted(optional))}"
        )
    extra_reqs = [req for e in extras for req in optional[e]]
    return [
        *data["project"]["dependencies"],
        *extra_reqs,
        *data["build-system"]["requires"],
        "wheel",
        *IMAGE_TOOLS,
    ]


def pip_download_command(
    base: BasePlatform, wheelhouse: Path, reqs: list[str], constraints: Path
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--dest",
        str(wheelhouse),
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        base.python,
        "-c",
        str(constraints),
    ]
    for tag in platform_tags(base):
        cmd += ["--platform", tag]
    return cmd + reqs


def download_wheels(
    base: BasePlatform,
    wheelhouse: Path,
    root: Path = REPO_ROOT,
    timeout_s: float = 1800.0,
    extras: tuple[str, ...] = (),
) -> list[Path]:
    """``pip download`` on the host; files already in the wheelhouse are reused."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    reqs = requirements(root, extras)
    cmd = pip_download_command(base, wheelhouse, reqs, root / "constraints.txt")
    try:
        subprocess.run(cmd, check=True, timeout=timeout_s)
    except subprocess.CalledProcessError as e:
        raise LabError(
            f"pip download failed (exit {e.returncode}); see pip's message above. "
            "The host must reach a package index or a --find-links directory "
            "holding wheels for the image's platform"
        ) from None
    except subprocess.TimeoutExpired:
        raise LabError(f"pip download took over {timeout_s:g} s; check the host's index") from None
    wheels = sorted(wheelhouse.glob("*.whl"))
    torch = [w for w in wheels if w.name.startswith("torch-")]
    if not any("+cpu" in w.name for w in torch):
        raise LabError(
            f"the wheelhouse has no CPU torch wheel ({[w.name for w in torch]}); "
            f"put the torch CPU wheel in a --find-links directory or {wheelhouse}"
        )
    return wheels


def stage_etcd(wheelhouse: Path) -> Path:
    """Copy this host's etcd into the wheelhouse, where the offline build installs it: the
    lab's live recovery runs its control plane on etcd, and an offline build has no apt.
    Debian's ``etcd-server`` on the host serves a Debian image (it needs only glibc)."""
    from ddp.torchfree import etcd_binary

    try:
        binary = etcd_binary()
    except FileNotFoundError as e:
        raise LabError(f"the offline image carries the host's etcd: {e}") from None
    wheelhouse.mkdir(parents=True, exist_ok=True)
    staged = wheelhouse / "etcd"
    shutil.copy2(binary, staged)
    return staged


def build_image(
    client: docker.DockerClient,
    tag: str,
    base_image: str,
    wheelhouse: Path | None = None,
    torch_index_url: str = TORCH_CPU_INDEX,
    root: Path = REPO_ROOT,
    echo: Callable[[str], None] = print,
    extras: tuple[str, ...] = (),
) -> None:
    """Build ``docker/Dockerfile``; with ``wheelhouse`` (inside ``root``) there is no network.
    ``extras`` are installed with the project and named in the image's ``lab.extras`` label."""
    if not (root / "docker" / "Dockerfile").is_file():
        raise LabError(f"no docker/Dockerfile under {root}; run lab image from a source checkout")
    args = {
        "BASE_IMAGE": base_image,
        "TORCH_INDEX_URL": torch_index_url,
        "EXTRAS": ",".join(extras),
    }
    if wheelhouse is not None:
        args["WHEELHOUSE"] = wheelhouse.resolve().relative_to(root).as_posix()
    stream = client.api.build(
        path=str(root),
        dockerfile="docker/Dockerfile",
        tag=tag,
        buildargs=args,
        labels={EXTRAS_LABEL: ",".join(extras)},
        rm=True,
        forcerm=True,
        decode=True,
        network_mode="none" if wheelhouse is not None else None,
    )
    for chunk in stream:
        if "stream" in chunk:
            text = chunk["stream"].rstrip()
            if text:
                echo(text)
        elif "error" in chunk:
            hint = (
                ""
                if wheelhouse is not None
                else (
                    "; where no registry or package index is reachable from builds, use "
                    "`python -m lab image --offline --base-image <local image with python3>`"
                )
            )
            raise LabError(f"image build failed: {chunk['error'].strip()}{hint}")
