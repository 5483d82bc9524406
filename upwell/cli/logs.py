"""``upwell logs JOB [SHARD | --shard S] [--follow]``: the payload.log of a job's shards.

The agent uploads each attempt's ``payload.log`` to ``results/<job>/<shard>/payload.log`` when the attempt
ends (``workers.staging``; a later attempt replaces it). Without a shard every shard's log is printed under a
``== <shard> ==`` line; ``--follow`` keeps listing the job's logs and prints each new or replaced one (told
apart by its ETag) until the job has ended, then exits 0. One listing per pass, whatever the shard count.
"""

from __future__ import annotations

import sys
import time

import typer

from upwell import names
from upwell.cli.shared import err, open_storage, resolve

LOG = "payload.log"


def _logs(storage, job_id: str, shard: str | None) -> dict[str, str]:
    """shard id -> ETag of its payload.log, for every shard (or the one asked for) that has one."""
    prefix = f"{job_id}/{shard}/" if shard else f"{job_id}/"
    found = {}
    for blob in storage.list(names.RESULTS, prefix):
        parts = blob.name.split("/")
        if len(parts) == 3 and parts[2] == LOG:
            found[parts[1]] = str(blob.etag)
    return found


def _ended(storage, job_id: str) -> bool:
    from upwell.ledger import JobState, Ledger

    row = Ledger(storage).job(job_id)
    return row is None or row.terminal or row.status == JobState.CANCELLED


def _print(storage, job_id: str, shard: str, header: bool) -> None:
    data = storage.read(f"{names.RESULTS}/{job_id}/{shard}/{LOG}").decode(errors="replace")
    if header:
        sys.stdout.write(f"== {shard} ==\n")
    sys.stdout.write(data if not data or data.endswith("\n") or not header else data + "\n")
    sys.stdout.flush()


def logs(job: str = typer.Argument(..., help="job id, name or upload path"),
         shard_arg: str = typer.Argument(None, metavar="[SHARD]", help="shard id, e.g. s00003 (or --shard)"),
         shard: str = typer.Option(None, "--shard", "-s", help="only this shard"),
         follow: bool = typer.Option(False, "--follow", "-f", help="print each new attempt's log until the job ends"),
         interval: float = typer.Option(2.0, help="with --follow: seconds between looks")) -> None:
    """Print the payload.log of a job's shards (their latest attempts); --follow prints new ones as they land."""
    from upwell.errors import NotFound

    storage = open_storage()
    job_id = resolve(storage, job)
    one = shard or shard_arg
    printed: dict[str, str] = {}
    while True:
        ended = follow and _ended(storage, job_id)  # read before the listing: nothing lands unseen after it
        for sid, etag in sorted(_logs(storage, job_id, one).items()):
            if printed.get(sid) != etag:
                try:
                    _print(storage, job_id, sid, header=not one or follow)
                except NotFound:
                    continue  # replaced between the listing and the read: the next pass prints the new one
                printed[sid] = etag
        if not follow or ended:
            break
        time.sleep(interval)
    if not printed and not follow:
        where = f"{job_id}/{one}" if one else job_id
        err.print(f"[red]no log for {where} yet[/] (results/{where}/{LOG}): no attempt has finished, or there is "
                  "no such shard", soft_wrap=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(logs)
