"""``upwell logs JOB [SHARD | --shard S] [--follow]``: the payload.log of a job's shards.

The agent uploads an attempt's ``payload.log`` to ``results/<job>/<shard>/payload.log`` when the attempt ends
and its payload printed something (``workers.staging.keep_log``; a later attempt replaces it). A shard whose
result is in but that has no log printed nothing: it is shown as ``(no output)``, never skipped, and so is a
shard with neither whose attempt ended all the same (a failed one awaiting its retry, a stopped one: its row
says so). Without a shard every shard's log is printed under a ``== <shard> ==`` line; with one, its log as
it is (``(no output)`` goes to stderr, so what stdout holds is the log). ``--follow`` keeps listing the job's
logs and prints each new or replaced one (told apart by its ETag) until the job has ended, then exits 0. One
listing per pass, whatever the shard count: it holds both the logs and the results (the shard rows are read
only without ``--follow``, and only when the job has shards the listing lacks).
"""

from __future__ import annotations

import sys
import time

import typer

from upwell import names
from upwell.cli.shared import err, open_storage, resolve

LOG = "payload.log"
NO_OUTPUT = "(no output)"


def _logs(storage, job_id: str, shard: str | None) -> dict[str, str]:
    """shard id -> what to print for it, for every shard (or the one asked for) that has a log or a result:
    ``log:<ETag>`` of its payload.log, else ``none:<ETag>`` of its result (it ended and printed nothing)."""
    logs, results = {}, {}
    for blob in storage.list(names.RESULTS, f"{job_id}/{shard}" if shard else f"{job_id}/"):
        parts = blob.name.split("/")
        if len(parts) == 3 and parts[2] == LOG:
            logs[parts[1]] = f"log:{blob.etag}"
        elif len(parts) == 2 and parts[1].endswith(".json"):
            results[parts[1][:-len(".json")]] = f"none:{blob.etag}"
    found = {**results, **logs}
    return {shard: found[shard]} if shard and shard in found else {} if shard else found


def _ended(storage, job_id: str) -> bool:
    from upwell.ledger import JobState, Ledger

    row = Ledger(storage).job(job_id)
    return row is None or row.terminal or row.status == JobState.CANCELLED


def _ran_silently(storage, job_id: str, shard: str) -> bool:
    """A shard with neither a log nor a result: did an attempt of it end all the same (a failed one that will
    be retried, or a stopped one)? Then it printed nothing. One row read, only in that case."""
    from upwell.ledger import Ledger

    row = Ledger(storage).shard(job_id, shard)
    return row is not None and row.attempt_ended


def _silent(storage, job_id: str, found: dict[str, str]) -> dict[str, str]:
    """The job's shards that the listing lacks (no log, no result) but whose attempt ended all the same, as
    ``none:attempt<k>``: they printed nothing. The job row first; its shard rows (one range query) only when
    it has more shards than the listing found."""
    from upwell.ledger import Ledger

    ledger = Ledger(storage)
    job = ledger.job(job_id)
    if job is None or job.shards_total <= len(found):
        return {}
    return {r.shard_id: f"none:attempt{r.attempts}" for r in ledger.shards(job_id)
            if r.shard_id not in found and r.attempt_ended}


def _print(storage, job_id: str, shard: str, what: str, header: bool) -> None:
    """One shard's log; a shard that printed nothing says so (under its header, or on stderr alone)."""
    data = storage.read(f"{names.RESULTS}/{job_id}/{shard}/{LOG}").decode(errors="replace") \
        if what.startswith("log:") else None
    if header:
        sys.stdout.write(f"== {shard} ==\n")
    if data is None:
        (sys.stdout if header else sys.stderr).write(f"{NO_OUTPUT}\n")
    else:
        sys.stdout.write(data if not data or data.endswith("\n") or not header else data + "\n")
    sys.stdout.flush()


def logs(job: str = typer.Argument(..., help="job id, name or upload path"),
         shard_arg: str = typer.Argument(None, metavar="[SHARD]", help="shard id, e.g. s00003 (or --shard)"),
         shard: str = typer.Option(None, "--shard", "-s", help="only this shard"),
         follow: bool = typer.Option(False, "--follow", "-f", help="print each new attempt's log until the job ends"),
         interval: float = typer.Option(2.0, help="with --follow: seconds between looks")) -> None:
    """Print the payload.log of a job's shards (their latest attempts; "(no output)" for one that printed
    nothing); --follow prints new ones as they land."""
    from upwell.errors import NotFound

    storage = open_storage()
    job_id = resolve(storage, job)
    one = shard or shard_arg
    printed: dict[str, str] = {}
    while True:
        ended = follow and _ended(storage, job_id)  # read before the listing: nothing lands unseen after it
        found = _logs(storage, job_id, one)
        if not follow and not one:
            found.update(_silent(storage, job_id, found))
        for sid, what in sorted(found.items()):
            if printed.get(sid) != what:
                try:
                    _print(storage, job_id, sid, what, header=not one or follow)
                except NotFound:
                    continue  # replaced between the listing and the read: the next pass prints the new one
                printed[sid] = what
        if not follow or ended:
            break
        time.sleep(interval)
    if not printed and not follow and one and _ran_silently(storage, job_id, one):
        sys.stderr.write(f"{NO_OUTPUT}\n")  # an attempt ended without a result and printed nothing
        return
    if not printed and not follow:
        where = f"{job_id}/{one}" if one else job_id
        err.print(f"[red]no log for {where} yet[/] (results/{where}/{LOG}): no attempt has finished, or there is "
                  "no such shard", soft_wrap=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(logs)
