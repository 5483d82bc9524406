"""The report's "Analysis" section: what the job's reduce step (upwell.after.reduce) produced, or why it
did not: its summary metrics as a table, its PNG outputs as figures, its other files listed with their
blobs, and, for a failed reduce, "done, analysis failed" with the error and where its log is."""

from __future__ import annotations

from collections.abc import Callable

from upwell import logs
from upwell.errors import UpwellError
from upwell.results.figures import Figure, Section, Table

log = logs.get("upwell.results.report.analysis")
TITLES = {"running": "Analysis (running)", "succeeded": "Analysis", "failed": "Analysis failed"}


def section(analysis: dict, fetch: Callable[[str], bytes]) -> Section:
    """The section for ``analysis`` (upwell.after.reduce.view's dict)."""
    status = str(analysis.get("status") or "")
    who = f"reduce job {analysis.get('job_id')}, attempt {analysis.get('attempt')}"
    if status == "failed":
        text = (f"Done, analysis failed ({who}): {analysis.get('error') or 'no reason recorded'}. "
                + (f"Its log: {analysis.get('log')}. " if analysis.get("log") else "It printed nothing. ")
                + "The shards' results and this report are intact; "
                "`upwell rerun JOB --reduce` runs the analysis alone again.")
    elif status == "running":
        text = f"The job's analysis is running on a worker pool ({who}); this report is built again when it ends."
    else:
        text = f"The job's own analysis, run once over every result ({who})."
    metrics = analysis.get("metrics") or {}
    tables = [Table("Summary", ["metric", "value"], [[k, v] for k, v in metrics.items()])] if metrics else []
    figures, files = [], []
    for name, blob in sorted((analysis.get("artifacts") or {}).items()):
        png = _png(fetch, str(blob)) if str(name).endswith(".png") else None
        if png is not None:
            figures.append(Figure(f"{name} (from the analysis)", png))
        else:
            files.append([name, blob])
    if files:
        tables.append(Table("Files", ["file", "blob"], files))
    return Section(TITLES.get(status, "Analysis"), text, figures=figures, tables=tables)


def _png(fetch: Callable[[str], bytes], blob: str) -> bytes | None:
    try:
        data = fetch(blob)
    except UpwellError as exc:  # a missing figure leaves the rest of the section
        log.warning("report.analysis_figure_missing", blob=blob[:300], error=str(exc)[:200])
        return None
    return data if data.startswith(b"\x89PNG") else None
