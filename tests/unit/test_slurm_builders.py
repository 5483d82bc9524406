"""The Slurm backend's pure parts: the sbatch script and argv, the squeue parser, state translation,
error kinds, the slurm.conf builder, and scale_to's choices against a recorded fake CLI."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from upwell.errors import ConfigError, PoolError, PoolErrorKind
from upwell.local.slurm_cluster import slurm_conf
from upwell.pools import backend_class
from upwell.pools import build_slurm as build
from upwell.pools.base import NodeState, PoolSpec
from upwell.pools.slurm import SlurmPool, translate_error


def spec(**options) -> PoolSpec:
    return PoolSpec("mpi", backend="slurm", vm_size="Standard_HB120rs_v3", max_nodes=4, options=options)


def sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_registered_as_a_backend():
    assert backend_class("slurm") is SlurmPool


def test_script_names_and_comments_the_job_with_the_pool():
    lines = sbatch_lines(build.batch_script(spec()))
    assert "--job-name=upwell-mpi" in lines
    assert "--comment=upwell-pool=mpi" in lines
    assert "--nodes=1" in lines and "--ntasks=1" in lines and "--cpus-per-task=1" in lines
    assert f"--signal=TERM@{build.DEFAULT_GRACE_S}" in lines
    assert "--no-requeue" in lines
    assert not any(line.startswith("--partition") for line in lines)


@pytest.mark.parametrize("options, expected", [
    ({"partition": "hpc"}, "--partition=hpc"),
    ({"account": "lab-a"}, "--account=lab-a"),
    ({"qos": "normal"}, "--qos=normal"),
    ({"constraint": "hbv3"}, "--constraint=hbv3"),
    ({"mem": "4G"}, "--mem=4G"),
    ({"gres": "gpu:1"}, "--gres=gpu:1"),
    ({"time": "8:00:00"}, "--time=8:00:00"),
    ({"time": "1-00:00:00"}, "--time=1-00:00:00"),
    ({"time": 90}, "--time=90"),
    ({"cpus_per_task": 4}, "--cpus-per-task=4"),
    ({"signal_grace_s": 30}, "--signal=TERM@30"),
    ({"requeue": True}, "--requeue"),
    ({"exclusive": True}, "--exclusive"),
    ({"output": "/shared/logs/%x-%j.out"}, "--output=/shared/logs/%x-%j.out"),
])
def test_options_become_directives(options, expected):
    assert expected in sbatch_lines(build.batch_script(spec(**options)))


@pytest.mark.parametrize("options, field", [
    ({"partition": "hpc; rm -rf /"}, "partition"),
    ({"time": "soon"}, "time"),
    ({"cpus_per_task": 0}, "cpus_per_task"),
    ({"cpus_per_task": "many"}, "cpus_per_task"),
    ({"srun_args": "--exclusive"}, "srun_args"),
])
def test_bad_options_name_the_setting(options, field):
    with pytest.raises(ConfigError, match=f"options.{field}"):
        build.batch_script(spec(**options))


def test_script_execs_srun_so_signals_reach_the_agent():
    script = build.batch_script(spec(cpus_per_task=4), python="/opt/venv/bin/python", workdir="/shared/upwell",
                                idle_exit_s=30)
    last = script.strip().splitlines()[-1]
    assert last.startswith("exec srun ")
    argv = shlex.split(last.replace('"$UPWELL_RANKS"', "4"))
    assert argv[:2] == ["exec", "srun"]
    assert "--cpus-per-task=4" in argv
    assert argv[argv.index("-m") - 1:] == ["/opt/venv/bin/python", "-m", "workers.agent", "--pool", "mpi",
                                           "--idle-exit", "30"]
    assert "cd /shared/upwell" in script


def test_script_is_valid_bash_and_sets_the_agent_environment(tmp_path):
    script = build.batch_script(spec(env={"UPWELL_LEASE_S": "30"}, storage_account="labdata",
                                     identity_client_id="1234"), state_dir=str(tmp_path))
    body = script.rsplit("exec srun", 1)[0] + 'env | sort\n'
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_CPUS_PER_TASK": "3"}).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["UPWELL_NODE_ID"] == build.node_id("mpi", "42") == "slurm-mpi-42"
    assert env["UPWELL_RANKS"] == "3"
    assert env["UPWELL_POOL"] == "mpi" and env["UPWELL_NODE_SPOT"] == "0"
    assert env["UPWELL_STATE_FILE"] == f"{tmp_path}/mpi/42.json"
    assert env["UPWELL_LEASE_S"] == "30"
    assert env["AzureWebJobsStorage__accountName"] == "labdata"
    assert env["AzureWebJobsStorage__credential"] == "managedidentity"
    assert not any(k == "AzureWebJobsStorage" for k in env)  # never a connection string in the script


def test_exclusive_ranks_are_the_node_cpus():
    script = build.batch_script(spec(exclusive=True))
    out = subprocess.run(["bash", "-c", script.rsplit("exec srun", 1)[0] + 'echo "$UPWELL_RANKS"'],
                         capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "1",
                              "SLURM_CPUS_ON_NODE": "120"}).stdout
    assert out.strip() == "120"


def test_spot_agents_go_to_the_spot_partition():
    s = spec(partition="hpc", spot_partition="hpc-spot")
    assert "--partition=hpc-spot" in sbatch_lines(build.batch_script(s, spot=True))
    assert "export UPWELL_NODE_SPOT=1" in build.batch_script(s, spot=True)
    assert "--partition=hpc" in sbatch_lines(build.batch_script(s))
    assert build.is_spot(s, "hpc-spot") and not build.is_spot(s, "hpc")
    with pytest.raises(ConfigError, match="spot_partition"):
        build.batch_script(spec(partition="hpc"), spot=True)


def test_cli_argv():
    assert build.sbatch_argv(spec()) == ["sbatch", "--parsable"]
    assert build.sbatch_argv(spec(sbatch_args=["--reservation=lab"])) == ["sbatch", "--parsable",
                                                                          "--reservation=lab"]
    assert build.squeue_argv(spec()) == ["squeue", "--noheader", "--states=all", "--name=upwell-mpi",
                                         f"--format={build.SQUEUE_FORMAT}"]
    assert build.scancel_argv(["3", "4"]) == ["scancel", "3", "4"]
    assert build.scancel_argv(["3"], signal="USR1") == ["scancel", "--signal=USR1", "3"]


@pytest.mark.parametrize("out, job", [("17\n", "17"), ("18;cluster-a\n", "18")])
def test_parse_job_id(out, job):
    assert build.parse_job_id(out) == job


@pytest.mark.parametrize("out", ["", "Submitted batch job 5", "error"])
def test_parse_job_id_refuses_other_output(out):
    with pytest.raises(ValueError):
        build.parse_job_id(out)


def test_parse_squeue_keeps_only_the_pools_jobs():
    out = ("11|RUNNING|hpc|n1|1|None|upwell-mpi|upwell-pool=mpi\n"
           "12|PENDING|hpc|(null)|2|Resources|upwell-mpi|upwell-pool=mpi\n"
           "13|RUNNING|hpc|n2|1|None|upwell-mpi|someone else's job\n"
           "14|COMPLETED|hpc|n1|1|None|upwell-cpu|upwell-pool=cpu\n"
           "15|CANCELLED by 0|hpc|n[1-2]|2|None|upwell-mpi|upwell-pool=mpi\n")
    jobs = build.parse_squeue(out, spec())
    assert [(j.job_id, j.state, j.nodes, j.size, j.reason) for j in jobs] == [
        ("11", "RUNNING", "n1", 1, ""), ("12", "PENDING", "", 2, "Resources"), ("15", "CANCELLED", "n[1-2]", 2, "")]
    with pytest.raises(ValueError, match="fields"):
        build.parse_squeue("11|RUNNING\n", spec())


@pytest.mark.parametrize("native, state", [
    ("PENDING", NodeState.PENDING), ("CONFIGURING", NodeState.PENDING), ("REQUEUED", NodeState.PENDING),
    ("RUNNING", NodeState.IDLE), ("SUSPENDED", NodeState.RUNNING), ("COMPLETING", NodeState.STOPPING),
    ("PREEMPTED", NodeState.PREEMPTED), ("NODE_FAIL", NodeState.FAILED), ("BOOT_FAIL", NodeState.FAILED),
    ("OUT_OF_MEMORY", NodeState.FAILED), ("SOMETHING_NEW", NodeState.UNKNOWN),
])
def test_translate_table(native, state):
    assert SlurmPool(spec(), client=lambda *a: "").node_state(native) is state


@pytest.mark.parametrize("stderr, kind", [
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, "
     "user's size and/or time limits)", PoolErrorKind.QUOTA),
    ("sbatch: error: QOSMaxSubmitJobPerUserLimit", PoolErrorKind.QUOTA),
    ("squeue: error: Unable to contact slurm controller (connect failure)", PoolErrorKind.THROTTLED),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     PoolErrorKind.AUTH),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", PoolErrorKind.CAPACITY),
    ("sbatch: error: something else", PoolErrorKind.OTHER),
])
def test_error_kinds(stderr, kind):
    err = translate_error("sbatch", stderr)
    assert isinstance(err, PoolError) and err.kind is kind


class FakeSlurm:
    """Answers squeue from a table and records every command (for scale_to's choices only;
    the real behaviour is tested against a real Slurm in test_slurm_pool.py)."""

    def __init__(self, rows: list[tuple]):
        self.rows, self.calls, self.scripts, self.next_id = rows, [], [], 100

    def __call__(self, argv: list[str], stdin: str | None = None) -> str:
        self.calls.append(argv)
        if argv[0] == "squeue":  # rows: (job id, state) or (job id, state, node count)
            return "".join(f"{r[0]}|{r[1]}|hpc|n1|{r[2] if len(r) > 2 else 1}|None|upwell-mpi|upwell-pool=mpi\n"
                           for r in self.rows)
        if argv[0] == "sbatch":
            assert stdin and stdin.startswith("#!/bin/bash")
            self.scripts.append(stdin)
            self.next_id += 1
            return f"{self.next_id}\n"
        return ""


def test_scale_in_cancels_pending_then_drains_idle_and_never_touches_busy():
    fake = FakeSlurm([("1", "RUNNING"), ("2", "RUNNING"), ("3", "RUNNING"), ("4", "PENDING"), ("5", "COMPLETED")])
    pool = SlurmPool(spec(), client=fake)
    busy = {"slurm-mpi-2"}
    status = pool.status(busy=busy)
    assert status.alive == 4 and status.idle == 2 and status.count(NodeState.RUNNING) == 1
    assert "slurm-mpi-5" not in status.nodes and status.nodes["slurm-mpi-2"] is NodeState.RUNNING
    pool.scale_to(0, busy=busy)
    assert ["scancel", "4"] in fake.calls
    assert ["scancel", "--signal=USR1", "3", "1"] in fake.calls
    assert not any("2" in call for call in fake.calls if call[0] == "scancel")
    after = pool.status(busy=busy)  # the drained ones count as leaving until they are gone
    assert after.count(NodeState.STOPPING) == 2 and after.alive == 2


def test_scale_out_submits_the_difference_with_a_spot_share():
    fake = FakeSlurm([("1", "RUNNING")])
    pool = SlurmPool(spec(partition="hpc", spot_partition="hpc-spot"), client=fake)
    pool.scale_to(4, spot=2)
    partitions = [next(line for line in sbatch_lines(s) if line.startswith("--partition")) for s in fake.scripts]
    assert sorted(partitions) == ["--partition=hpc", "--partition=hpc-spot", "--partition=hpc-spot"]
    fake.rows = [("1", "RUNNING"), ("2", "PENDING")]
    fake.calls.clear()
    pool.scale_to(2)
    assert not any(c[0] in ("sbatch", "scancel") for c in fake.calls)


def test_slurm_conf_for_a_local_cluster(tmp_path):
    text = slurm_conf(tmp_path, ctld_port=7001, node_ports={"n1": 7002, "n2": 7003}, cpus=2, host="h")
    conf = [line for line in text.splitlines() if line]
    assert "AuthType=auth/none" in conf and "SlurmctldPort=7001" in conf
    assert "SlurmctldHost=h(127.0.0.1)" in conf
    assert f"StateSaveLocation={tmp_path}/state" in conf
    assert any(line.startswith("NodeName=n2 ") and "Port=7003" in line for line in conf)
    assert "PartitionName=upwell Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20" in conf
    assert "PartitionName=spot Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20" in conf
    assert "PreemptType=preempt/partition_prio" in conf


def test_rest_job_carries_what_the_sbatch_lines_say():
    s = spec(partition="hpc", account="lab", qos="normal", constraint="hbv3", mem="4G", time="1-02:00:00",
             cpus_per_task=8, exclusive=True, output="/shared/%j.out", signal_grace_s=60)
    body = build.rest_job(s, "#!/bin/bash\n", {"UPWELL_POOL": "mpi"}, workdir="/shared/upwell")
    assert body["script"] == "#!/bin/bash\n"
    assert body["job"] == {"name": "upwell-mpi", "comment": "upwell-pool=mpi", "nodes": "1", "tasks": 1,
                           "cpus_per_task": 8, "signal": "TERM@60", "requeue": False,
                           "current_working_directory": "/shared/upwell", "environment": {"UPWELL_POOL": "mpi"},
                           "partition": "hpc", "account": "lab", "qos": "normal", "constraints": "hbv3",
                           "memory_per_node": 4096, "time_limit": 1560, "exclusive": "exclusive",
                           "standard_output": "/shared/%j.out"}
    assert build.rest_job(spec(partition="htc", spot_partition="spot"), "", {}, spot=True)["job"]["partition"] == "spot"
    with pytest.raises(ConfigError, match="gres"):
        build.rest_job(spec(gres="gpu:1"), "", {})


@pytest.mark.parametrize("limit, minutes", [("90", 90), ("8:00:00", 480), ("1-00:00:00", 1440), ("30:30", 31),
                                            ("2-12", 3600)])
def test_time_minutes(limit, minutes):
    assert build.time_minutes(limit) == minutes


def test_parse_rest_jobs_like_squeue():
    doc = {"jobs": [
        {"job_id": 21, "job_state": "RUNNING", "partition": "hpc", "nodes": "n1", "state_reason": "None",
         "name": "upwell-mpi", "comment": "upwell-pool=mpi"},
        {"job_id": 22, "job_state": ["PENDING"], "partition": "hpc", "nodes": "", "state_reason": "Priority",
         "name": "upwell-mpi", "comment": {"job": "upwell-pool=mpi"}},
        {"job_id": 23, "job_state": "RUNNING", "name": "upwell-mpi", "comment": "not ours"},
    ]}
    assert [(j.job_id, j.state, j.nodes, j.reason) for j in build.parse_rest_jobs(doc, spec())] == [
        ("21", "RUNNING", "n1", ""), ("22", "PENDING", "", "Priority")]


def test_a_missing_slurm_says_how_to_install_it(monkeypatch):
    from upwell.local.slurm_cluster import SlurmUnavailable, find

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SlurmUnavailable, match=r"make slurm.*apt-get install -y slurm-wlm slurmrestd"):
        find("sbatch-that-is-not-there")


def test_rest_client_sends_the_user_and_the_token_from_its_env_var():
    """The REST client's request shape against a local server that records it (the JWT path; the real
    slurmrestd test in test_slurm_pool.py uses local auth)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from upwell.pools.slurm import RestDriver

    seen: list[tuple[str, str, dict, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path, dict(self.headers), body))
            status, doc = (401, {"errors": [{"error": "Authentication failure"}]}) if "nope" in self.path \
                else (200, {"errors": [], "job_id": 77, "jobs": []})
            raw = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rest = RestDriver(f"http://127.0.0.1:{server.server_port}", user="lab", token_env="LAB_JWT",
                          env={"LAB_JWT": "token-123"})
        assert rest.submit(spec(partition="hpc"), "#!/bin/bash\n", env={"UPWELL_POOL": "mpi"}) == "77"
        rest.cancel(["5"], signal="USR1")
        assert rest.jobs(spec()) == []
        with pytest.raises(PoolError) as err:
            rest.call("GET", "/nope")
        assert err.value.kind is PoolErrorKind.AUTH
    finally:
        server.shutdown()
    (method, path, headers, body), cancel = seen[0], seen[1]
    assert (method, path) == ("POST", "/slurm/v0.0.38/job/submit")
    assert headers["X-SLURM-USER-NAME"] == "lab" and headers["X-SLURM-USER-TOKEN"] == "token-123"
    sent = json.loads(body)
    assert sent["job"]["partition"] == "hpc" and sent["job"]["environment"] == {"UPWELL_POOL": "mpi"}
    assert cancel[:2] == ("DELETE", "/slurm/v0.0.38/job/5?signal=USR1")


def idle_exit(script: str) -> str:
    """The agent's --idle-exit on the script's exec line."""
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    argv = shlex.split(exec_line)
    return argv[argv.index("--idle-exit") + 1]


def test_the_first_min_nodes_agents_are_warm_counted_and_drained_last(tmp_path):
    """Issue 25 item 15: the first min_nodes agent jobs run with the warm idle exit (0: never), are marked
    in the state folder, are not started again while they live, and scale-in drains the others first."""
    from dataclasses import replace

    fake = FakeSlurm([])
    pool = SlurmPool(replace(spec(state_dir=str(tmp_path)), min_nodes=1), client=fake)
    pool.scale_to(3)
    assert [idle_exit(s) for s in fake.scripts] == ["0", "120", "120"], fake.scripts
    assert "export UPWELL_IDLE_EXIT_S=0\n" in fake.scripts[0] and "UPWELL_IDLE_EXIT_S=120" in fake.scripts[1]
    assert sorted(p.name for p in (tmp_path / "mpi").glob("*.warm")) == ["101.warm"]
    fake.rows, fake.scripts = [("101", "RUNNING"), ("102", "RUNNING"), ("103", "RUNNING")], []
    pool.scale_to(4)  # the warm one lives: the new agent is not warm
    assert [idle_exit(s) for s in fake.scripts] == ["120"]
    (tmp_path / "mpi" / "101.warm").rename(tmp_path / "mpi" / "103.warm")  # now the newest job is the warm one
    pool.scale_to(1, busy=set())
    assert ["scancel", "--signal=USR1", "102", "101"] in fake.calls, fake.calls
    other = FakeSlurm([])  # a warm idle timeout instead of never
    SlurmPool(replace(spec(state_dir=str(tmp_path / "w"), warm_idle_exit_s=900), min_nodes=1), client=other).scale_to(1)
    assert [idle_exit(s) for s in other.scripts] == ["900"]
