"""GROMACS as a payload by definition (payloads/gromacs-md.yaml), with Debian's gmx (thread-MPI).

- through upwell and by a bare gmx mdrun -reprod with the same inputs and seed, the energies agree;
- a temperature sweep through the real agent on Azurite: each point's mean temperature is within 2%
  of its set value, and the report has the definition's table and plots;
- SIGTERM through the real agent: mdrun writes state.cpt, the attempt counts as a preemption, the next
  attempt continues with -cpi from step N > 0, and the step count equals an uninterrupted run's.

A machine without gmx FAILS these tests with how to install it (never a silent skip).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_agent_preempt import _agent, _wait
from upwell import names
from upwell.errors import InputRejected
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.messages import WorkItem
from upwell.payloads.argv import values_for
from upwell.payloads.definition import render
from upwell.payloads.registry import builtins
from upwell.provenance import image_digest
from upwell.settings import Settings
from upwell.storage import Storage
from workers.launch import run_payload

HOW = ("GROMACS is not installed: `make gromacs` as root on Debian/Ubuntu (apt-get install gromacs), "
       "or put a gmx built with thread-MPI on PATH")


@pytest.fixture(scope="module")
def gmx() -> str:
    found = shutil.which("gmx")
    if found is None:
        pytest.fail(HOW, pytrace=False)
    return found


def _energy(workdir: Path, term: str, nmol: int | None = None) -> str:
    argv = ["gmx", "-quiet", "energy", "-f", "md.edr", "-o", f"bare-{term}.xvg"]
    argv += ["-nmol", str(nmol)] if nmol else []
    subprocess.run(argv, cwd=workdir, input=f"{term}\n\n".encode(), capture_output=True, check=True)
    return "\n".join(line for line in (workdir / f"bare-{term}.xvg").read_text().splitlines()
                     if not line.startswith(("#", "@")))


def test_energies_agree_with_a_bare_mdrun_reprod(gmx, tmp_path):
    params = {"temperature": 300.0, "nsteps": 400, "seed": 7}
    item = WorkItem(job_id="j", shard_id="s", payload="gromacs-md", pool="cpu", params=params)
    result = run_payload(item, tmp_path / "upwell")
    assert result.status == "succeeded", result.stderr_tail
    assert result.definition["name"] == "gromacs-md" and result.definition["image_digest"].startswith("sha256:")

    # The bare run: the same rendered inputs, the same gmx, called by hand.
    d = builtins()["gromacs-md"].definition
    bare = tmp_path / "bare"
    bare.mkdir()
    full = {**{k: p.default for k, p in d.params.items()}, **params}
    values = values_for(d, item, bare, full)
    for name, template in d.files.items():
        (bare / name).write_text(render(template, values))
    env = {**dict(__import__("os").environ), "GMX_MAXBACKUP": "-1"}
    for argv in (["gmx", "-quiet", "solvate", "-cs", "spc216.gro", "-box", "1.86206", "-o", "conf.gro"],
                 ["gmx", "-quiet", "grompp", "-f", "md.mdp", "-c", "conf.gro", "-p", "topol.top", "-o", "md.tpr"],
                 ["gmx", "-quiet", "mdrun", "-deffnm", "md", "-ntmpi", "1", "-ntomp", "1", "-reprod"]):
        done = subprocess.run(argv, cwd=bare, env=env, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    ours = tmp_path / "ours"
    ours.mkdir()
    shutil.copy2(tmp_path / "upwell" / "md.edr", ours / "md.edr")
    for term, nmol in (("Potential", 216), ("Temperature", None), ("Total-Energy", None)):
        a, b = _energy(ours, term, nmol), _energy(bare, term, nmol)
        assert a == b and len(a.splitlines()) == 400 // 50 + 1, term
    assert result.metrics["energy_steps"] == 401 and abs(result.metrics["final_time_ps"] - 0.8) < 1e-9
    assert -50 < result.metrics["potential_per_molecule"] < -40  # SPC/E water: about -46.5 kJ/mol near 300 K


def test_bad_params_are_refused_before_anything_runs(gmx, tmp_path):
    for bad in ({"temperature": 1000.0}, {"nsteps": "5000; rm -rf /"}, {"mdp": "x"}):
        item = WorkItem(job_id="j", shard_id="s", payload="gromacs-md", pool="cpu", params=bad)
        with pytest.raises(InputRejected) as exc:
            run_payload(item, tmp_path)
        assert exc.value.field.startswith("params.")
    assert not (tmp_path / "md.tpr").exists()


def _ingest(store: Storage, name: str, manifest: bytes) -> str:
    store.ensure()
    store.queue(names.work_queue("cpu")).clear_messages()
    store.blob(names.INCOMING, name).upload_blob(manifest, overwrite=True)
    outcome = Ingestor(store, Settings()).ingest(name)
    assert outcome.status == "accepted", outcome.message
    return outcome.job_id


def test_temperature_sweep_through_the_agent_reaches_the_set_temperatures(gmx, azurite, tmp_path):
    from upwell.results.report import build_report
    from upwell.rows import JobRow

    store = Storage(azurite.connection_string)
    job_id = _ingest(store, "gmx/sweep/job.yaml", b"payload: gromacs-md\nparams: {nsteps: 2500}\n"
                                                  b"grid: {temperature: [280, 360]}\n")
    agent = _agent(azurite.connection_string, "cpu", tmp_path)
    out = agent.communicate(timeout=300)[0].decode()
    assert agent.returncode == 0, out[-3000:]
    second = _agent(azurite.connection_string, "cpu", tmp_path)
    out = second.communicate(timeout=300)[0].decode()
    assert second.returncode == 0, out[-3000:]
    docs = [json.loads(store.read(f"results/{job_id}/s0000{i}.json")) for i in range(2)]
    for doc in docs:
        assert doc["status"] == "succeeded", doc.get("error")
        set_t, mean_t = doc["params"]["temperature"], doc["metrics"]["temperature_mean"]
        assert abs(mean_t - set_t) / set_t < 0.02, (set_t, mean_t)
        prov = doc["provenance"]["definition"]
        assert prov["name"] == "gromacs-md" and prov["version"] == "1.0.0" and prov["sha256"].startswith("sha256:")
        # the definition pins the all-zero placeholder, so the result records the node's own image ("local" here)
        assert doc["provenance"]["image_digest"] == image_digest(prov["image_digest"], "local") == "local"
        assert doc["provenance"].get("tool_version", "").startswith("GROMACS version"), doc["provenance"]
        assert {"potential.xvg", "temperature.xvg", "md.log", "md.edr"} <= set(doc["artifacts"])
    cold, hot = sorted(docs, key=lambda d: d["params"]["temperature"])
    assert cold["metrics"]["potential_per_molecule"] < hot["metrics"]["potential_per_molecule"]
    files = build_report(JobRow.from_entity({"job_id": job_id, "payload": "gromacs-md"}), Ledger(store).shards(job_id),
                         docs, [], fetch=store.read)
    html = files["index.html"].decode()
    assert "potential_per_molecule" in html and "temperature_mean" in html
    assert sum(1 for f in files if f.startswith("figures/gromacs-md")) == 2, sorted(files)


def test_sigterm_checkpoints_and_the_next_attempt_continues(gmx, azurite, tmp_path):
    store = Storage(azurite.connection_string)
    nsteps = 6000
    job_id = _ingest(store, "gmx/preempt/job.yaml",
                     f"payload: gromacs-md\nparams: {{nsteps: {nsteps}}}\ngrid: {{temperature: [300]}}\n".encode())
    ledger = Ledger(store)
    first = _agent(azurite.connection_string, "cpu", tmp_path)
    _wait(lambda: getattr(ledger.shard(job_id, "s00000"), "status", None) == "running", 60, "the shard to start")
    log = lambda: "".join(p.read_text(errors="replace") for p in tmp_path.glob("upwell-*/work/payload.log"))  # noqa: E731
    _wait(lambda: "starting mdrun" in log(), 120, "mdrun to start")
    _wait(lambda: any(p.stat().st_size > 2000 for p in tmp_path.glob("upwell-*/work/md.edr")), 120, "energy frames")
    assert first.poll() is None, first.stdout.read().decode()[-3000:]
    first.send_signal(signal.SIGTERM)
    out = first.communicate(timeout=120)[0].decode()
    assert first.returncode == 0 and "agent.preempted" in out, out[-3000:]
    shard = ledger.shard(job_id, "s00000")
    assert shard.status == "preempted" and shard.preemptions == 1 and not shard.failures
    kept = {b.name.rsplit("/", 1)[1] for b in store.list(names.CHECKPOINTS, f"{job_id}/s00000/")}
    assert {"state.cpt", "md.log", "md.edr"} <= kept

    second = _agent(azurite.connection_string, "cpu", tmp_path)
    out2 = second.communicate(timeout=300)[0].decode()
    assert second.returncode == 0, out2[-3000:]
    doc = json.loads(store.read(f"results/{job_id}/s00000.json"))
    assert doc["status"] == "succeeded", doc.get("error")
    m = doc["metrics"]
    assert 0 < m["continued_from_step"] < nsteps, m  # the GROMACS log: "continuing from step N"
    assert m["energy_steps"] == nsteps + 1 and abs(m["final_time_ps"] - nsteps * 0.002) < 1e-9, m
    assert doc["timings"]["preemptions"] == 1 and doc["timings"]["resumed_from"] == "checkpoint"
    assert abs(m["temperature_mean"] - 300) / 300 < 0.02
    shard = ledger.shard(job_id, "s00000")
    assert shard.preemptions == 1 and not shard.failures
