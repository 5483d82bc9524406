"""The MPI image's sshd for Batch gangs: read from the Dockerfile and the files it installs, and checked
against what the Batch task builders ask of it (upwell.pools.build_batch_tasks).

No Docker engine is needed: the Dockerfile and the configs are parsed. What they must say: sshd and the
client are installed, the package's host keys are dropped (each task makes its own), the user key is made
at build (so all nodes of a gang share it) and no key is in the repository, sshd runs as the image's user
on a port above 1024 that the client uses too, key login of that user only, and the user has a shell.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from upwell.pools import build_batch, build_batch_tasks

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "workers" / "docker"
DOCKERFILE = (DOCKER / "Dockerfile.mpi").read_text()
SSHD = (DOCKER / "gang_sshd_config").read_text()
CLIENT = (DOCKER / "gang_ssh_config").read_text()
SCRIPT = (DOCKER / "gang-sshd.sh").read_text()


def settings(text: str) -> dict[str, str]:
    """{keyword (lower case): the rest of its line} of an ssh(d)_config, comments dropped."""
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition(" ")
            out[key.lower()] = value.strip()
    return out


def run_steps() -> list[str]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith(("RUN ", "USER "))]


def test_sshd_and_client_are_installed_without_the_package_host_keys():
    install = next(s for s in run_steps() if "apt-get install" in s and "openssh-server" in s)
    assert "openssh-client" in install and "rm -rf" in install and "/etc/ssh/ssh_host_*" in install
    assert "ssh-keygen -q -t ed25519" in SCRIPT and '"$DIR/host_ed25519"' in SCRIPT  # a host key per task


def test_the_user_key_is_made_at_build_by_the_image_user_and_authorised_for_the_gang():
    steps = run_steps()
    user_at = steps.index("USER upwell")
    keygen = next(i for i, s in enumerate(steps) if "ssh-keygen" in s)
    assert keygen > user_at  # made by (and owned by) the image's user, who runs sshd and mpiexec
    step = steps[keygen]
    assert "-f /home/upwell/.ssh/id_ed25519" in step and "-N ''" in step
    assert "id_ed25519.pub /home/upwell/.ssh/authorized_keys" in step
    assert "gang_ssh_config /home/upwell/.ssh/config" in step
    useradd = next(s for s in steps if "useradd" in s)
    assert "--shell /bin/sh" in useradd  # sshd runs a remote command through the login shell; nologin refuses


def test_no_private_key_is_in_the_repository():
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        path = ROOT / name
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert not re.search(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----", path.read_bytes()), name


def test_sshd_allows_key_login_of_the_image_user_only():
    conf = settings(SSHD)
    assert conf["allowusers"] == build_batch.AGENT_USER == "upwell"
    assert conf["pubkeyauthentication"] == "yes" and conf["passwordauthentication"] == "no"
    assert conf["kbdinteractiveauthentication"] == "no" and conf["permitrootlogin"] == "no"
    assert conf["usepam"] == "no"  # PAM needs root; this sshd runs as the image's user
    assert "PYTHONPATH=/app" in conf["setenv"]  # remote ranks import the payloads as the image does
    assert "port" not in conf  # on the command line, from the one default below


def test_server_and_client_agree_on_a_port_a_non_root_sshd_can_bind():
    port = int(re.search(r'PORT="\$\{UPWELL_SSHD_PORT:-(\d+)\}"', SCRIPT)[1])
    assert port > 1024 and port != 22  # the node's own sshd has 22, on the same (host) network
    assert settings(CLIENT)["port"] == str(port) and f"EXPOSE {port}" in DOCKERFILE
    assert '-o "Port=$PORT"' in SCRIPT and "-f /app/workers/docker/gang_sshd_config" in SCRIPT
    client = settings(CLIENT)
    assert client["user"] == "upwell" and client["batchmode"] == "yes"
    assert client["stricthostkeychecking"] == "no"  # the peers' host keys are new with every task


def test_the_coordination_command_is_the_script_and_it_waits_until_sshd_listens():
    assert build_batch_tasks.SSHD_COORDINATION == "/bin/sh /app/workers/docker/gang-sshd.sh"
    assert "COPY workers/ workers/" in DOCKERFILE and "WORKDIR /app" in DOCKERFILE  # the script's path
    assert SCRIPT.startswith("#!/bin/sh\n") and "set -eu" in SCRIPT
    assert "create_connection(('127.0.0.1'" in SCRIPT and "exit 1" in SCRIPT  # ready, or the task fails
    assert subprocess.run(["sh", "-n", str(DOCKER / "gang-sshd.sh")]).returncode == 0
