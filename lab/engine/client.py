"""Reaching the Docker engine, and lab's errors: each says what went wrong and what to do."""

from __future__ import annotations

import docker.errors
import requests.exceptions

from lab.engine.specs import DEFAULT_IMAGE

__all__ = [
    "GONE",
    "EngineUnreachable",
    "ImageMissing",
    "LabError",
    "NodeFailed",
    "RunTimeout",
    "connect",
    "require_image",
]

# What the SDK raises when a container, exec or stream is gone (removed, killed, engine down).
GONE = (docker.errors.DockerException, requests.exceptions.RequestException)

_BUILD_HINT = (
    "build it with `python -m lab image` (pulls from registries) or, with no registry, "
    "`python -m lab image --offline --base-image IMAGE` (any local image with python3)"
)


class LabError(Exception):
    """An error for the user: the message says what happened and what to do next."""


class ImageMissing(LabError):
    pass


class EngineUnreachable(LabError):
    """An engine named by --hosts does not answer: bad input, refused before the run."""


class NodeFailed(LabError):
    """A rank or node exited before the run finished."""


class RunTimeout(LabError):
    """A run or phase did not finish within its --run-timeout."""


def connect(timeout_s: float = 120.0, endpoint: str = "") -> docker.DockerClient:
    """A client whose API calls time out after ``timeout_s`` (log streams are not limited),
    of ``endpoint`` (``unix://``, ``tcp://``, ``ssh://``), or by default of the engine
    ``DOCKER_HOST`` names or the local one."""
    try:
        if endpoint:
            client = docker.DockerClient(base_url=endpoint, timeout=int(timeout_s))
        else:
            client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except GONE as e:
        if endpoint:
            raise EngineUnreachable(
                f"cannot reach the Docker engine {endpoint} ({str(e).splitlines()[0][:160]}); "
                "start it, or drop it from --hosts"
            ) from None
        raise LabError(
            f"cannot reach the Docker engine ({e}); start it (e.g. `dockerd &` as root) or "
            "point DOCKER_HOST at a running one"
        ) from None
    return client


def require_image(client: docker.DockerClient, image: str = DEFAULT_IMAGE) -> None:
    """Fail early, before any container exists, if the image was never built."""
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        hint = _BUILD_HINT if image == DEFAULT_IMAGE else _BUILD_HINT + f" and --tag {image}"
        raise ImageMissing(f"image {image} not found; {hint}") from None
