"""Offline image build inputs: the pip download command for the image's platform."""

from pathlib import Path

from lab.engine.build import BasePlatform, pip_download_command, platform_tags, requirements

BOOKWORM = BasePlatform(python="3.11", machine="x86_64", glibc=(2, 36))


def test_platform_tags_cover_every_older_manylinux():
    tags = platform_tags(BOOKWORM)
    assert tags[0] == "manylinux_2_36_x86_64"
    # The torch CPU wheel is manylinux_2_28; psutil's is manylinux2010 (glibc 2.12).
    for tag in ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64"):
        assert tag in tags
    old = platform_tags(BasePlatform("3.11", "aarch64", (2, 17)))
    assert "manylinux_2_28_aarch64" not in old and "manylinux2014_aarch64" in old


def test_requirements_include_torch_and_the_build_backend():
    reqs = requirements()
    assert any(r.startswith("torch") for r in reqs)
    assert any(r.startswith("setuptools") for r in reqs)  # the image builds the project itself


def test_download_command_targets_the_image_not_the_host(tmp_path):
    cmd = pip_download_command(BOOKWORM, tmp_path, ["torch"], Path("constraints.txt"))
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--only-binary=:all:" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.11"
    assert cmd[cmd.index("--dest") + 1] == str(tmp_path)
    assert cmd[cmd.index("-c") + 1] == "constraints.txt"
    assert cmd.count("--platform") == len(platform_tags(BOOKWORM))
    assert cmd[-1] == "torch"
