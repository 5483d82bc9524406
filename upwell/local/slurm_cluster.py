"""A real Slurm cluster on this machine: one slurmctld and a slurmd per node, in the foreground.

For the Slurm pool's tests and for trying the pool locally. Everything lives in
one folder: slurm.conf, the controller's state, each node's spool, the logs.
Authentication is ``auth/none`` (nothing leaves the loopback) and the ports are
free ones, not Slurm's defaults, so a machine's own Slurm is left alone. Several
slurmd run on one host through ``slurmd -N <node>``, each on its own port.

Two arrangements. By default every node is this host at 127.0.0.1 (the one-node
agents' tests). With ``hosts=True`` (the multi-node MPI tests) each node is a host
of its own: node i listens on 127.0.0.(i+1) and its slurmd runs in a UTS namespace
of its own whose host name is the node's name (``unshare --uts``, as root), so the
job steps and MPI ranks it starts see ``n1`` or ``n2`` as the machine they are on;
pmix's per-node server sockets go to ``TmpFS=<root>/%n/tmp`` so the two slurmd do
not share them. Why not also a network namespace: 127.0.0.0/8 is all on ``lo`` in
any namespace, so the nodes get their own addresses without one, and in the host's
network namespace the agents reach Azurite on 127.0.0.1 directly; a private network
would need a relay for every storage port (tried: ``srun --mpi=pmix`` across n1 and
n2 gives size 2, one rank per node, a correct allreduce, with the venv's Open MPI
and mpi4py and Debian's ``mpi_pmix`` plugin, which needs ``libpmix-dev``).

``slurm_conf`` is a pure builder; ``LocalSlurm`` keeps the folder, the ports and
the daemon processes, and stops them (after cancelling every job) on ``stop``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "slurmrestd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
HOW_TO_INSTALL = ("Slurm is not installed here. On Debian or Ubuntu, as root: `make slurm` (it runs "
                  "`apt-get install -y slurm-wlm slurmrestd libpmix-dev`); elsewhere install Slurm 22.05 or later "
                  "so that "
                  "slurmctld, slurmd, slurmrestd, sbatch, squeue, scancel, scontrol, sinfo and srun are on PATH "
                  "(the daemons are often in /usr/sbin).")


# Where Debian's mpi_pmix plugin looks for libpmix.so (slurm-wlm is built --with-pmix=<multiarch>/pmix2);
# libpmix2 ships only libpmix.so.2 there, libpmix-dev the libpmix.so the plugin opens.
PMIX_DIRS = ("/usr/lib/x86_64-linux-gnu/pmix2/lib", "/usr/lib/aarch64-linux-gnu/pmix2/lib")


class SlurmUnavailable(RuntimeError):
    """Slurm is missing or would not start; the message says what to do."""


def find(program: str) -> str:
    """The path of a Slurm program (PATH, then /usr/sbin and /usr/local/sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    found = shutil.which(program, path=path)
    if not found:
        raise SlurmUnavailable(f"{program} not found. {HOW_TO_INSTALL}")
    return found


def find_tool(program: str) -> str:
    found = shutil.which(program, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if not found:
        raise SlurmUnavailable(f"{program} not found: the multi-node cluster needs util-linux's unshare "
                               "(Debian: apt-get install util-linux)")
    return found


def check_hosts() -> None:
    """The multi-node arrangement needs root (a UTS namespace per node), unshare, and Debian's pmix
    plugin's library (libpmix.so from libpmix-dev), which ``srun --mpi=pmix`` loads."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("the multi-node Slurm cluster runs each slurmd in a UTS namespace of its own, "
                               "which needs root; run the multinode tests as root")
    find_tool("unshare")
    debian = [Path(d) for d in PMIX_DIRS if Path(d).is_dir()]
    if debian and not any((d / "libpmix.so").exists() for d in debian):
        raise SlurmUnavailable("srun --mpi=pmix cannot load PMIx: libpmix.so is missing. On Debian or Ubuntu, "
                               "as root: `make slurm` (it runs `apt-get install -y libpmix-dev`)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_addr(index: int, hosts: bool) -> str:
    """The loopback address of the ``index``-th node (0-based): its own with ``hosts``, else 127.0.0.1."""
    return f"127.0.0.{index + 2}" if hosts else "127.0.0.1"


def slurm_conf(root: Path, *, ctld_port: int, node_ports: dict[str, int], cpus: int = 2,
               host: str | None = None, kill_wait_s: int = 5, grace_s: int = 20, cluster: str = "upwell",
               hosts: bool = False) -> str:
    """slurm.conf for a one-host cluster under ``root``: auth/none, the given ports, no accounting.
    ``hosts``: each node a host of its own (its name, its loopback address, its pmix TmpFS)."""
    host = host or socket.gethostname()
    nodes = [f"NodeName={name} NodeHostname={name if hosts else host} NodeAddr={node_addr(i, hosts)} "
             f"Port={port} CPUs={cpus} RealMemory=1000 State=UNKNOWN"
             for i, (name, port) in enumerate(node_ports.items())]
    first = next(iter(node_ports.values()))
    return "\n".join([
        f"ClusterName={cluster}", f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}", f"SlurmdPort={first}",
        "AuthType=auth/none", "CredType=cred/none", "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log", f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
        *([f"TmpFS={root}/%n/tmp"] if hosts else []),
        "MpiDefault=none", "MailProg=/bin/true", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill", "SchedulerParameters=bf_interval=1",
        "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none", "ReturnToService=2", f"KillWait={kill_wait_s}",
        "MinJobAge=120", "SlurmdParameters=config_overrides", "SlurmdTimeout=30", "SlurmctldTimeout=30",
        # A job in `urgent` preempts jobs in `upwell`: SIGCONT + SIGTERM, SIGKILL after GraceTime (as a
        # site's high-priority partition, or a CycleCloud spot nodearray's eviction, would end an agent).
        "PreemptType=preempt/partition_prio", "PreemptMode=CANCEL",
        *nodes,
        f"PartitionName=upwell Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
        f"GraceTime={grace_s}",
        # The spot partition: where a pool's spot share of agents goes (options.spot_partition), as a
        # CycleCloud spot nodearray's partition would take them; `urgent` preempts it like `upwell`.
        f"PartitionName=spot Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 GraceTime={grace_s}",
        "PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF", ""])


@dataclass
class LocalSlurm:
    """A running cluster: ``env`` holds SLURM_CONF for the client commands."""

    root: Path
    nodes: tuple[str, ...] = ("n1", "n2")
    cpus: int = 2
    hosts: bool = False  # each node a host of its own (see the module docstring); needs root and unshare
    procs: list[subprocess.Popen] = field(default_factory=list)
    rest_url: str = ""  # set once start_rest() has started slurmrestd

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 30.0) -> LocalSlurm:
        binaries = {p: find(p) for p in (*DAEMONS, *CLIENTS)}
        if self.hosts:
            check_hosts()
        for sub in ("state", "log", *(f"spool/{n}" for n in self.nodes), *(f"{n}/tmp" for n in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        ports = {n: free_port() for n in self.nodes}
        self.conf.write_text(slurm_conf(self.root, ctld_port=free_port(), node_ports=ports, cpus=self.cpus,
                                        hosts=self.hosts))
        self._spawn([binaries["slurmctld"], "-D", "-i"], "slurmctld")
        for node in self.nodes:
            slurmd = [binaries["slurmd"], "-D", "-N", node]
            if self.hosts:  # its own host name: unshare, then `hostname` and exec slurmd in that namespace
                slurmd = [find_tool("unshare"), "--uts", "/bin/sh", "-c",
                          'hostname "$0" && exec "$@"', node, *slurmd]
            self._spawn(slurmd, f"slurmd-{node}")
        try:
            self.wait_idle(timeout)
        except SlurmUnavailable:
            self.stop()
            raise
        return self

    def _spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - handed to the child
        self.procs.append(subprocess.Popen(argv, env=env or self.env, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True))
        out.close()

    def start_rest(self, timeout: float = 15.0) -> str:
        """slurmrestd on a unix socket (local auth: the caller's uid); returns its URL for the pool.
        Root may run it here only because SLURMRESTD_SECURITY=disable_user_check says so."""
        if self.rest_url:
            return self.rest_url
        sock = self.root / "slurmrestd.sock"
        self._spawn([find("slurmrestd"), "-a", "rest_auth/local", "-s", "openapi/v0.0.38", f"unix:{sock}"],
                    "slurmrestd", {**self.env, "SLURMRESTD_SECURITY": "disable_user_check"})
        deadline = time.monotonic() + timeout
        while not sock.exists():
            if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                raise SlurmUnavailable(f"slurmrestd did not start; logs:\n{self.logs()}")
            time.sleep(0.1)
        self.rest_url = f"unix:{sock}"
        return self.rest_url

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run([find(argv[0]), *argv[1:]], env=self.env, capture_output=True, text=True,
                              timeout=30, check=False)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N|%T", check=False)
        return dict(line.split("|", 1) for line in out.split() if "|" in line)

    def wait_idle(self, timeout: float) -> None:
        """Until every node answers (idle, mixed or allocated), or raise with the daemons' logs."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                break
            states = self.node_states()
            if len(states) == len(self.nodes) and all(s.rstrip("*") in ("idle", "mixed", "allocated")
                                                      for s in states.values()):
                return
            time.sleep(0.3)
        raise SlurmUnavailable(f"the local Slurm did not come up (nodes: {states}); logs:\n{self.logs()}")

    def logs(self, tail: int = 20) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"== {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self, timeout: float = 20.0) -> None:
        """Cancel every job (payloads get SIGTERM, then SIGKILL after KillWait), then stop the daemons."""
        if self.procs and all(p.poll() is None for p in self.procs):
            self.run("scancel", f"--user={pwd.getpwuid(os.getuid()).pw_name}", check=False)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.run("squeue", "--noheader", check=False).strip():
                time.sleep(0.3)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
