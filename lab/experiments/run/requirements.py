"""``lab run --requirements FILE``: the script's extra packages, built into an image derived from
the lab image, with no package index needed at run time and none inside the build.

On the host, ``pip download`` fetches wheels for the image's Python and platform (probed by
running the lab image, as ``lab image --offline`` does) into a wheelhouse cached by the file's
hash and the lab image's id; then ``FROM <lab image>`` installs them with ``--no-index``, the
build's network off. The derived image is tagged by the same hash, so a second run with the
same file and image builds nothing. A file whose packages pip cannot resolve is refused before
any container exists (exit 2, pip's own last line beside it).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import docker.errors

import docker
from lab.engine.build import platform_tags, probe_base
from lab.engine.client import LabError, require_image
from lab.engine.distribute import image_id
from lab.experiments.run.plan import RunPlan

__all__ = ["WHEELHOUSES", "derived_tag", "image_for", "resolve"]

WHEELHOUSES = Path.home() / ".cache" / "ddp-lab" / "wheelhouses"
_DOCKERFILE = """\
ARG BASE
FROM ${BASE}
COPY wheels/ /tmp/wheels/
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-index --find-links /tmp/wheels -r /tmp/requirements.txt && rm -rf /tmp/wheels
"""


def _key(plan: RunPlan, base_id: str) -> str:
    assert plan.requirements is not None
    h = hashlib.sha256(plan.requirements.read_bytes())
    h.update(base_id.encode())
    return h.hexdigest()[:12]


def derived_tag(image: str, key: str) -> str:
    """``ddp-lab:latest`` + key -> ``ddp-lab:latest-req-<key>``."""
    repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    return f"{repo}:{tag}-req-{key}"


def _wheelhouse(client: docker.DockerClient, plan: RunPlan) -> tuple[Path, str]:
    """Download the wheels (cached); (the wheelhouse, the key). ValueError if pip cannot."""
    require_image(client, plan.image)
    base_id = image_id(client, plan.image) or plan.image
    key = _key(plan, base_id)
    house = WHEELHOUSES / key
    if (house / ".complete").is_file():
        return house, key
    base = probe_base(client, plan.image)
    house.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--dest", str(house), "--only-binary=:all:",
        "--implementation", "cp", "--python-version", base.python, "-r", str(plan.requirements),
    ]  # fmt: skip
    for tag in platform_tags(base):
        cmd += ["--platform", tag]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise ValueError(f"--requirements {plan.requirements}: pip took over 900 s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ValueError(
            f"--requirements {plan.requirements} does not resolve for the image's Python "
            f"{base.python} ({base.machine}): {last}"
        )
    (house / ".complete").write_text("")
    return house, key


def resolve(plan: RunPlan) -> None:
    """Before the run: the wheels are there (downloaded now if not); ValueError if not."""
    if plan.requirements is None:
        return
    from lab.engine.client import connect

    client = connect()
    try:
        _wheelhouse(client, plan)
    finally:
        client.close()


def _context(house: Path, requirements: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = (
            ("Dockerfile", _DOCKERFILE.encode()),
            ("requirements.txt", requirements.read_bytes()),
        )
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(house, arcname="wheels")
    return buf.getvalue()


def image_for(client: docker.DockerClient, plan: RunPlan, echo: Callable[[str], None]) -> str:
    """The image the run uses: the lab image, or the one derived with the requirements."""
    if plan.requirements is None:
        return plan.image
    house, key = _wheelhouse(client, plan)
    tag = derived_tag(plan.image, key)
    try:
        client.images.get(tag)
        echo(f"image {tag}: {plan.requirements} already built in")
        return tag
    except docker.errors.ImageNotFound:
        pass
    echo(f"image {tag}: building {plan.requirements} into {plan.image} (offline, from {house})")
    stream = client.api.build(
        fileobj=io.BytesIO(_context(house, plan.requirements)),
        custom_context=True,
        tag=tag,
        buildargs={"BASE": plan.image},
        network_mode="none",
        rm=True,
        forcerm=True,
        decode=True,
    )
    for chunk in stream:
        if "error" in chunk:
            raise LabError(f"building {tag} failed: {chunk['error'].strip()}")
    return tag
