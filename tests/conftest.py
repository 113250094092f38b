"""Shared fixtures. The Docker tier's engine client lives here so its three test files skip
alike, with the same reason, where no engine answers or the lab image is missing.

Nothing here imports the docker SDK at module level: pytest loads this file for every test,
and a torch-only install (``pip install -e .``, no ``[lab]`` extra) must still run tests/ddp.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def client():
    """A Docker client whose engine answers and has the lab image (else: skip, saying why)."""
    docker = pytest.importorskip("docker", reason="the docker SDK is not installed ([lab] extra)")
    import requests.exceptions

    from lab.engine.specs import DEFAULT_IMAGE

    try:
        engine = docker.from_env(timeout=60)
        engine.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        pytest.skip(f"no Docker engine answers ({e})")
    try:
        engine.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(
            f"image {DEFAULT_IMAGE} missing: run python -m lab image (or, with no registry, "
            "python -m lab image --offline --base-image python:3.11-slim)"
        )
    return engine
