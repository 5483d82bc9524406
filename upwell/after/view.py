"""What ``upwell status`` (and the dashboard) shows of a job's after-life: the chain it is part of, its
analysis, and its notifications, as data plus the lines a terminal prints."""

from __future__ import annotations

from upwell.after import state
from upwell.after.spec import of_job
from upwell.ledger import Ledger
from upwell.rows import JobRow


def after_view(ledger: Ledger, job: JobRow) -> dict:
    """``chain``, ``analysis``, ``notify`` (each only where the job has one) and ``after_lines``."""
    ask, out, lines = of_job(job), {}, []
    parent, children = state.field(job, "after_parent_id"), [c for c in state.field(job, "chain_children").split(",")
                                                              if c]
    if ask.after or children or state.field(job, "reduce_of"):
        out["chain"] = {"after": ask.after, "parent": parent, "state": state.field(job, "chain_state"),
                        "children": children, "reduce_of": state.field(job, "reduce_of")}
        if ask.after:
            lines.append(f"after: {ask.after}" + (f" ({parent})" if parent and parent != ask.after else "")
                         + (f", {state.field(job, 'chain_state')}" if state.field(job, "chain_state") else ""))
        for child in children:
            row = ledger.job(child)
            lines.append(f"then: {child} ({row.status.value if row else 'gone'})")
        if state.field(job, "reduce_of"):
            lines.append(f"the analysis of {state.field(job, 'reduce_of')}")
    if state.field(job, "analysis_state"):
        out["analysis"] = {k: state.field(job, f"analysis_{k}") for k in ("state", "job", "attempt", "error")}
        shown = "done, analysis failed" if out["analysis"]["state"] == state.FAILED else out["analysis"]["state"]
        lines.append(f"analysis: {shown} ({out['analysis']['job']})"
                     + (f": {out['analysis']['error'][:200]}" if out["analysis"]["error"] else ""))
    if ask.notify is not None:
        out["notify"] = {"events": list(ask.notify.events), "sent": state.field(job, "notify_sent"),
                         "delivered": state.field(job, "notify_delivered"), "failed": state.field(job, "notify_failed")}
        if out["notify"]["failed"]:
            lines.append(out["notify"]["failed"][:300])
    out["after_lines"] = lines
    return out
