"""The service blocks of the generated files, pure: fields in their order, notes beside them."""

import yaml

from lab.tools.yaml_services import AFTER_INIT, service, shell, words


def test_a_service_is_the_yaml_of_its_parts():
    text = service(
        "worker",
        "stack",
        profiles=["torchrun"],
        networks=["net"],
        depends_on={**AFTER_INIT, "rdzv": "service_started"},
        environment=["A: '1'", "B: x  # kept"],
        entrypoint=shell(["echo a", "b;", "exit 0"]),
        deploy=["replicas: 2"],
    )
    assert text.startswith("  worker:\n    profiles: [torchrun]\n    image: ${LAB_IMAGE:-")
    worker = yaml.safe_load(text)["worker"]
    assert list(worker) == [
        "profiles",
        "image",
        "labels",
        "volumes",
        "networks",
        "depends_on",
        "environment",
        "entrypoint",
        "deploy",
    ]
    assert worker["labels"] == {"lab.run": "stack"} and worker["volumes"] == ["shared:/shared"]
    assert worker["depends_on"] == {
        "init": {"condition": "service_completed_successfully"},
        "rdzv": {"condition": "service_started"},
    }
    assert worker["environment"] == {"A": "1", "B": "x"} and "B: x  # kept" in text
    assert worker["entrypoint"] == ["sh", "-c", "echo a b; exit 0"]
    assert worker["deploy"] == {"replicas": 2}


def test_without_the_volume_and_with_a_flow_entrypoint():
    done = yaml.safe_load(service("done", "compose", shared=False, entrypoint='["true"]'))
    assert done == {
        "done": {
            "image": "${LAB_IMAGE:-ddp-lab:latest}",
            "labels": {"lab.run": "compose"},
            "entrypoint": ["true"],
        }
    }
    assert yaml.safe_load(words("python", "-m", "x")) == ["python", "-m", "x"]


def test_notes_trail_a_value_or_stand_above_a_block():
    text = service(
        "x-node",
        "compose",
        anchor="&node",
        environment="&env\nK: v",
        entrypoint=words("env"),
        notes={"lab.run": "found by down", "entrypoint": "what runs"},
        indent=0,
    )
    lines = text.splitlines()
    assert lines[0] == "x-node: &node" and "  environment: &env" in lines
    label = next(line for line in lines if "lab.run" in line)
    assert label.index("#") == 40 and label.endswith("# found by down")
    at = lines.index("  entrypoint:")
    assert lines[at - 1] == "  # what runs"
    assert yaml.safe_load(text)["x-node"]["entrypoint"] == ["env"]
