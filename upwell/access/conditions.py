"""The ABAC conditions (version 2.0) that restrict a role assignment on the storage account to one project.

Followed: learn.microsoft.com "Example Azure role assignment conditions for Blob Storage"
(storage/blobs/storage-auth-abac-examples: "Read, write, or delete blobs in named containers", "Read or
list blobs in named containers with a path", "Read blobs with a blob index tag") and the attribute list
(storage-auth-abac-attributes): the blob path attribute holds the name *without* the container, so a
project's uploads are ``containers:name StringEquals 'incoming' AND blobs:path StringStartsWith 'P/'``.

Each condition is an AND of blocks, one per group of actions, in the documented shape
``( ( !(ActionMatches{...}) AND ... ) OR ( expression ) )``: an action outside a block passes it.
- writes (write, add, delete, move): only under ``incoming/P/``; an operator also in ``payloads`` and
  ``pipelines``. Nothing else: no results, reports, other projects.
- read a blob (blobs/read, NOT Blob.List): under ``incoming/P/``, or a blob of the job containers whose
  index tag ``project`` is P (case-sensitive key, value StringEquals).
- list blobs (Blob.List): ``incoming`` only with the prefix ``P/``; the job containers' names (job and
  shard ids, never content) may be listed, because List Blobs has no tag attribute to test.
"""

from __future__ import annotations

import re

from upwell import names
from upwell.errors import InputRejected

BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
CONTAINER_NAME = "Microsoft.Storage/storageAccounts/blobServices/containers:name"
BLOB_PATH = f"{BLOBS}:path"
CONTAINER = f"@Resource[{CONTAINER_NAME}]"
PATH = f"@Resource[{BLOB_PATH}]"
PREFIX = f"@Request[{BLOBS}:prefix]"
TAG_KEY = "project"
TAG = f"@Resource[{BLOBS}/tags:{TAG_KEY}<$key_case_sensitive$>]"
WRITES = (f"{BLOBS}/write", f"{BLOBS}/add/action", f"{BLOBS}/delete", f"{BLOBS}/move/action")
# The containers whose blobs upwell writes for a job and tags project=<name>.
TAGGED = (names.SHARDS, names.CHECKPOINTS, names.RESULTS, names.REPORTS, names.QUARANTINE)
REGISTRY = (names.PAYLOADS, names.PIPELINES)  # what only an operator writes
_PROJECT = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


class BadProject(InputRejected):
    """A project name that cannot be a path segment and a tag value in a condition."""


def check_project(project: str) -> str:
    """The project name, or BadProject: lower-case letters, digits and inner hyphens, 1-63 characters
    (it is quoted in conditions, a path segment under incoming/ and a blob index tag value)."""
    if not _PROJECT.match(project or ""):
        raise BadProject(f"project {project!r} must be 1-63 lower-case letters, digits or inner hyphens",
                         field="project")
    return project


def _values(items: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"'{v}'" for v in items) + "}"


def _block(actions: list[str], expression: str) -> str:
    """One documented block: the listed actions pass only where ``expression`` holds."""
    return "(\n (\n  " + "\n  AND\n  ".join(f"!({a})" for a in actions) + f"\n )\n OR\n (\n  {expression}\n )\n)"


def _under_incoming(project: str, attribute: str = PATH) -> str:
    return f"({CONTAINER} StringEquals '{names.INCOMING}' AND {attribute} StringStartsWith '{project}/')"


def write_block(project: str, *, operator: bool) -> str:
    expression = _under_incoming(project)
    if operator:
        expression = f"{expression} OR ({CONTAINER} ForAnyOfAnyValues:StringEquals {_values(REGISTRY)})"
    return _block([f"ActionMatches{{'{a}'}}" for a in WRITES], expression)


def read_block(project: str) -> str:
    tagged = f"({CONTAINER} ForAnyOfAnyValues:StringEquals {_values(TAGGED)} AND {TAG} StringEquals '{project}')"
    return _block([f"ActionMatches{{'{BLOBS}/read'}} AND NOT SubOperationMatches{{'Blob.List'}}"],
                  f"{_under_incoming(project)} OR {tagged}")


def list_block(project: str) -> str:
    listed = f"({CONTAINER} ForAnyOfAnyValues:StringEquals {_values(TAGGED)})"
    return _block([f"ActionMatches{{'{BLOBS}/read'}} AND SubOperationMatches{{'Blob.List'}}"],
                  f"{_under_incoming(project, PREFIX)} OR {listed}")


def condition(project: str, *, write: bool, operator: bool = False) -> str:
    """The whole condition for one project's role assignment: the read and list blocks, and the write
    block where the role writes at all."""
    check_project(project)
    blocks = [read_block(project), list_block(project)]
    if write:
        blocks.insert(0, write_block(project, operator=operator))
    return "\nAND\n".join(blocks)
