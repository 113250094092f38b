"""Shared fixtures. The Docker tier's engine client lives here so its three test files skip
alike, with the same reason, where no engine answers or the lab image is missing."""

from __future__ import annotations

import docker.errors
import pytest
import requests.exceptions

from lab.engine.specs import DEFAULT_IMAGE


@pytest.fixture(scope="session")
def client():
    """A Docker client whose engine answers and has the lab image (else: skip, saying why)."""
    try:
        engine = docker.from_env(timeout=60)
        engine.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        pytest.skip(f"no Docker engine answers ({e})")
    try:
        engine.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(
            f"image {DEFAULT_IMAGE} missing: run python -m lab image --offline "
            "--base-image lab-base:offline (or python -m lab image)"
        )
    return engine
