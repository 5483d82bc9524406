"""Commands on one job after it is in: cancel, rerun, delete, prune (logs: ``upwell.cli.logs``).

Every JOB argument takes a job id, a unique start of one, a job name, or the path it was uploaded to.
"""

from __future__ import annotations

import typer
from rich.console import Console

from upwell.cli.shared import err, open_storage, resolve
from upwell.errors import UpwellError

console = Console()


def _fail(exc: UpwellError) -> None:
    err.print(f"[red]{exc}[/]", soft_wrap=True)
    raise typer.Exit(1)


# What each (state at the cancel, state after it) means, as `upwell cancel` reports it.
_OUTCOME = {("queued", "cancelled"): "-> cancelled (never started)",
            ("preempted", "cancelled"): "-> cancelled (its checkpoint kept for a re-run)",
            ("running", "cancelled"): "-> checkpointed and stopped (cancelled)",
            ("running", "running"): "-> still stopping",
            ("running", "succeeded"): "-> finished before it could stop (succeeded, kept)",
            ("running", "failed"): "-> failed before it could stop"}


def _outcome(was: str, now: str) -> str:
    return _OUTCOME.get((was, now)) or ("unchanged (it had ended)" if was == now else f"-> {now}")


def _confirmed(question: str) -> bool:
    """The user's yes; no answer (an empty stdin, Ctrl-D, Ctrl-C) is a no."""
    try:
        return typer.confirm(question, default=False, err=True)
    except typer.Abort:
        return False


def cancel(job: str = typer.Argument(..., help="job id, name or upload path"),
           wait: float = typer.Option(60.0, help="seconds to wait for running shards to checkpoint and stop")) -> None:
    """Stop a job: no more dispatch, its queued messages drained, running shards checkpoint and stop."""
    from upwell.lifecycle.cancel import cancel_job

    storage = open_storage()
    job_id = resolve(storage, job)
    try:
        c = cancel_job(storage, job_id, wait_s=wait)
    except UpwellError as exc:
        _fail(exc)
    console.print(f"cancelled {job_id}: {c.drained} queued message(s) drained; its shards, per state:",
                  soft_wrap=True, markup=False)
    for was, now, n in c.outcome:
        console.print(f"  {n:5d} {was:<10} {_outcome(was, now)}", soft_wrap=True, markup=False)
    if c.still_running:
        console.print(f"{c.still_running} shard(s) still stopping; `upwell status {job_id}` shows when they have",
                      soft_wrap=True, markup=False)


def rerun(job: str = typer.Argument(..., help="job id, name or upload path"),
          failed: bool = typer.Option(False, "--failed", help="only the failed shards"),
          shard: list[str] = typer.Option(None, "--shard", help="this shard (repeatable)"),
          everything: bool = typer.Option(False, "--all", help="every shard, the succeeded ones too"),
          reduce: bool = typer.Option(False, "--reduce", help="only the job's reduce step (its analysis)")) -> None:
    """Re-run a job's shards: by default every one that did not succeed (failed or cancelled)."""
    from upwell.lifecycle.rerun import rerun_job, rerun_reduce

    if sum(map(bool, (failed, shard, everything, reduce))) > 1:
        err.print("[red]give one of --failed, --shard, --all, --reduce[/]")
        raise typer.Exit(2)
    storage = open_storage()
    job_id = resolve(storage, job)
    if reduce:
        try:
            started = rerun_reduce(storage, job_id)
        except UpwellError as exc:
            _fail(exc)
        console.print(f"re-running the analysis of {job_id} as {started}", soft_wrap=True, markup=False)
        return
    try:
        again = rerun_job(storage, job_id, failed=failed, shard_ids=shard or None, everything=everything)
    except UpwellError as exc:
        _fail(exc)
    if not again:
        console.print(f"nothing to re-run in {job_id}", soft_wrap=True, markup=False)
        return
    console.print(f"re-running {len(again)} shard(s) of {job_id}: {', '.join(again[:20])}"
                  f"{' ...' if len(again) > 20 else ''}", soft_wrap=True, markup=False)


def delete(job: str = typer.Argument(..., help="job id, name or upload path"),
           yes: bool = typer.Option(False, "--yes", "-y", help="do not ask; delete at once"),
           force: bool = typer.Option(False, "--force", help="cancel the job first if it is still running")) -> None:
    """Remove a job's blobs (shards, checkpoints, results, report, its upload) and its ledger rows. Says what it
    will remove and asks first (--yes skips the question)."""
    from upwell.lifecycle.cleanup import delete_job, plan_delete

    storage = open_storage()
    job_id = resolve(storage, job)
    try:
        plan = plan_delete(storage, job_id, force=force)
    except UpwellError as exc:
        _fail(exc)
    console.print(f"delete {job_id} ({plan.status}): {plan.blobs} blob(s) and {plan.rows} ledger row(s)",
                  soft_wrap=True, markup=False)
    for where, count in plan.places:
        console.print(f"  {where}  ({count} blob{'' if count == 1 else 's'})", soft_wrap=True, markup=False)
    if not yes and not _confirmed("delete these?"):
        console.print("nothing deleted (--yes deletes without asking)", markup=False)
        raise typer.Exit(1)
    try:
        d = delete_job(storage, job_id, force=force)
    except UpwellError as exc:
        _fail(exc)
    console.print(f"deleted {job_id}: {d.blobs} blob(s), {d.rows} row(s)", soft_wrap=True, markup=False)


def prune(older_than: str = typer.Option(..., "--older-than", help="age such as 30d, 12h, 90m"),
          dry_run: bool = typer.Option(False, "--dry-run", help="list what would go, remove nothing")) -> None:
    """Delete every ended job (succeeded, failed, rejected, cancelled) older than the given age."""
    from upwell.lifecycle.cleanup import parse_age
    from upwell.lifecycle.cleanup import prune as do_prune

    try:
        gone = do_prune(open_storage(), parse_age(older_than), dry_run=dry_run)
    except UpwellError as exc:
        _fail(exc)
    for d in gone:
        console.print(f"{'would delete' if dry_run else 'deleted'} {d.job_id}"
                      + ("" if dry_run else f" ({d.blobs} blobs, {d.rows} rows)"), soft_wrap=True, markup=False)
    console.print(f"{len(gone)} job(s) {'would be ' if dry_run else ''}pruned", markup=False)


def register(app: typer.Typer) -> None:
    for fn in (cancel, rerun, delete, prune):
        app.command()(fn)
