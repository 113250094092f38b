"""``python -m lab image``: build the lab image from a registry, or offline from a wheelhouse."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lab.engine.specs import DEFAULT_IMAGE

if TYPE_CHECKING:
    import docker

NAME = "image"
HELP = "build the lab image (from registries, or --offline from a host-side wheelhouse)"
DESCRIPTION = (
    "Build the image every node runs: CPU torch and this project. With a registry the build "
    "starts from python:3.11-slim and takes torch from the PyTorch CPU index; --offline runs "
    "the base image once to learn its Python and platform, downloads the wheels on the host "
    "and builds with no network inside. Rebuild after changing ddp/ or lab/. With --hosts the "
    "image is built once, on the first host, and streamed to every other engine (docker save "
    "and load through the SDK), which a run across hosts requires: the same image id on all."
)
EPILOG = "Exit codes: 0 built, 1 the build failed (the message says why), 2 bad arguments."


@dataclass(frozen=True)
class ImagePlan:
    offline: bool
    base_image: str
    tag: str
    torch_index_url: str
    wheelhouse: Path
    build: bool = True
    extras: tuple[str, ...] = ()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--offline",
        action="store_true",
        help="pip download wheels on the host, build with no network inside",
    )
    p.add_argument(
        "--base-image",
        default="python:3.11-slim",
        help="base image with python3 (default %(default)s)",
    )
    p.add_argument("--tag", default=DEFAULT_IMAGE, help="image tag (default %(default)s)")
    p.add_argument(
        "--torch-index-url",
        default="https://download.pytorch.org/whl/cpu",
        help="registry builds: index of CPU torch wheels (default %(default)s)",
    )
    p.add_argument(
        "--wheelhouse",
        type=Path,
        default=Path("docker/wheelhouse"),
        help="offline builds: wheel directory inside the repo (default %(default)s)",
    )
    p.add_argument(
        "--extras",
        default="",
        metavar="LIST",
        help="optional extras of pyproject.toml to install too, comma-separated (torchft: "
        "lab kill --recovery torchft); pinned by constraints.txt, named in the image's "
        "lab.extras label (default: none)",
    )
    p.add_argument(
        "--hosts",
        metavar="LIST|FILE",
        help="Docker engines to put the image on, as every experiment's --hosts: built on the "
        "first, then streamed to the others (default: the local engine alone)",
    )
    p.add_argument(
        "--no-build",
        dest="build",
        action="store_false",
        help="only stream the first host's --tag to the other --hosts (no build)",
    )


def plan(args: argparse.Namespace) -> ImagePlan:
    extras = tuple(e.strip() for e in args.extras.split(",") if e.strip())
    return ImagePlan(
        args.offline,
        args.base_image,
        args.tag,
        args.torch_index_url,
        args.wheelhouse,
        args.build,
        extras,
    )


def run(plan: ImagePlan) -> str:
    from lab.engine.client import connect
    from lab.engine.distribute import image_id, stream_image
    from lab.engine.placement import current

    # a build step may print nothing for minutes, a load neither
    members = [(h, connect(3600, h.endpoint)) for h in current().hosts]
    if plan.build:
        _build(plan, members[0][1])
    for member in members[1:]:
        stream_image(members[0], member, plan.tag)
    if len(members) == 1:
        return f"built {plan.tag}"
    names = ", ".join(h.name for h, _ in members)
    return f"{plan.tag} on {names}: the same image id {image_id(members[0][1], plan.tag)[7:19]}"


def _build(plan: ImagePlan, client: docker.DockerClient) -> None:
    from lab.engine.build import build_image, download_wheels, probe_base, stage_etcd

    wheelhouse = None
    if plan.offline:
        base = probe_base(client, plan.base_image)
        print(
            f"base image {plan.base_image}: Python {base.python}, {base.machine}, "
            f"glibc {base.glibc[0]}.{base.glibc[1]}; downloading wheels into {plan.wheelhouse}/"
        )
        wheels = download_wheels(base, plan.wheelhouse, extras=plan.extras)
        etcd = stage_etcd(plan.wheelhouse)
        print(f"{len(wheels)} wheels and {etcd} in {plan.wheelhouse}/; building with no network")
        wheelhouse = plan.wheelhouse
    build_image(
        client, plan.tag, plan.base_image, wheelhouse, plan.torch_index_url, extras=plan.extras
    )


def report(line: str) -> int:
    print(line)
    return 0
