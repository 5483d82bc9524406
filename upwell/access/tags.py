"""The project of a job, and the blob index tag that carries it on every blob upwell writes for the job.

A project is the unit of access (issue 27): uploads land under ``incoming/<project>/``, and the shards,
checkpoints, results, artifacts, reports and quarantined input of a job carry the index tag
``project=<name>`` that the viewers' ABAC conditions test (``upwell.access.conditions``).

Followed: learn.microsoft.com "Manage and find Azure Blob data with blob index tags" (keys and values are
case-sensitive strings; setting them on upload is ``x-ms-tags``, which needs blobs/tags/write); the project
names that ``conditions.check_project`` allows are valid tag values.
"""

from __future__ import annotations

from upwell.access.conditions import TAG_KEY, BadProject, check_project


def project_tags(project: str) -> dict[str, str]:
    """The index tags of a blob of ``project``; {} for none."""
    return {TAG_KEY: project} if project else {}


def folder_project(name: str) -> str:
    """The project an incoming name's first folder names (``<project>/...``), or "" when it names none."""
    first, sep, _ = name.partition("/")
    if not sep:
        return ""
    try:
        return check_project(first)
    except BadProject:
        return ""


def job_project(name: str, declared: str, default: str, *, strict: bool) -> str:
    """A job's project: the one its manifest or rule declares, else its upload's folder, else ``default``.

    Strict (UPWELL_PROJECT_FOLDERS, on in the Azure deployment): the folder decides, as the uploaders' role
    conditions do, and a manifest that declares another project is refused, so nobody reaches another
    project's budget and viewers by naming it. The result is always a valid project name (BadProject)."""
    folder = folder_project(name)
    if strict:
        if not folder:
            raise BadProject(f"incoming/{name[:200]} is not under incoming/<project>/", field="project")
        if declared and declared != folder:
            raise BadProject(f"the manifest names project {declared!r} but was uploaded under incoming/{folder}/; "
                             "a job belongs to the project folder it is uploaded to", field="project")
        return folder
    return check_project(declared or folder or default)
