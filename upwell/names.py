"""The storage and configuration names that the code and the Bicep templates share.

Every container, queue, table and app-setting name lives here once; the
name-consistency test checks that `bicep/` creates exactly these.
"""

from __future__ import annotations

# Blob containers (DESIGN.md "Contracts").
INCOMING = "incoming"
PIPELINES = "pipelines"
SHARDS = "shards"
CHECKPOINTS = "checkpoints"
RESULTS = "results"
REPORTS = "reports"
QUARANTINE = "quarantine"
PAYLOADS = "payloads"  # registered payload definitions; written by operators only (its own RBAC role)
CONTAINERS = (INCOMING, PIPELINES, SHARDS, CHECKPOINTS, RESULTS, REPORTS, QUARANTINE, PAYLOADS)

# The Functions host keeps its own containers; the devhost uses the same names.
HOST_RECEIPTS = "azure-webjobs-hosts"
BLOB_POISON_QUEUE = "webjobs-blobtrigger-poison"
HOST_SECRETS = "azure-webjobs-secrets"


def blob_trigger_queue(host_id: str) -> str:
    """The host queue that the blobs extension puts Event Grid-sourced blob events on."""
    return f"azure-webjobs-blobtrigger-{host_id}"


# Event Grid: undeliverable events land here (bicep/main.bicep deadLetterContainerName).
EVENTGRID_DEADLETTER = "eventgrid-deadletter"
# Locally only: the event publisher's own state (the Event Grid service keeps it on Azure).
LOCAL_EVENTGRID_STATE = "upwell-local-eventgrid"

# Queues: one per pool, each with a -poison twin, plus the report queue.
POOLS = ("cpu", "mpi", "gpu")
POISON_SUFFIX = "-poison"
REPORT_QUEUE = "report"


def work_queue(pool: str) -> str:
    """The work queue of a pool: `work-<pool>`."""
    return f"work-{pool}"


def poison_queue(queue: str) -> str:
    return f"{queue}{POISON_SUFFIX}"


NOTIFY_QUEUE = "notify"  # one message per job event to deliver (upwell.after.notify)
QUEUES = tuple(work_queue(p) for p in POOLS) + (REPORT_QUEUE, NOTIFY_QUEUE)
ALL_QUEUES = QUEUES + tuple(poison_queue(q) for q in QUEUES)

# Table storage.
JOBS_TABLE = "jobs"
SCALE_TABLE = "scaling"
JANITOR_TABLE = "janitor"  # every janitor finding and action (upwell.ops.findings)
JOB_INDEX_TABLE = "jobindex"  # the open jobs and the latest ended ones (upwell.jobindex, the ledger's)
NODES_TABLE = "nodes"  # the agents' heartbeats and the scaler's drain marks (upwell.nodelog)
TABLES = (JOBS_TABLE, SCALE_TABLE, JANITOR_TABLE, JOB_INDEX_TABLE, NODES_TABLE)
JOB_ROW = "job"

# The connection the functions bind to ("connection=" in the handlers).  On Azure
# it is identity based: STORAGE__serviceUri / __blobServiceUri ..., __credential,
# __clientId. Locally it is the Azurite development connection string.
CONNECTION = "AzureWebJobsStorage"

# App settings that upwell reads (see upwell.settings).
APP_SETTINGS = (
    "UPWELL_POOLS",
    "UPWELL_SCALE_SCHEDULE",
    "UPWELL_SCALE_ON_INGEST",
    "UPWELL_RECONCILE_SCHEDULE",
    "UPWELL_RECONCILE_SOURCE",
    "UPWELL_MAX_UPLOAD_BYTES",
    "UPWELL_MAX_SHARDS",
    "UPWELL_MAX_MESSAGE_BYTES",
    "UPWELL_MAX_PARAM_BYTES",
    "UPWELL_MAX_CONCURRENCY",
    "UPWELL_IMAGE_ALLOWLIST",
    "UPWELL_REGISTRY_ALLOWLIST",
    "UPWELL_BATCH_ACCOUNT_URL",
    "UPWELL_SUBSCRIPTION_ID",
    "UPWELL_RESOURCE_GROUP",
    "UPWELL_WORKER_IDENTITY_ID",
    "UPWELL_WORKER_IMAGE_CPU",
    "UPWELL_WORKER_IMAGE_GPU",
    "AZURE_CLIENT_ID",
    "UPWELL_PROJECT_FOLDERS",
    "UPWELL_EVENTGRID_ENDPOINT",
    "UPWELL_KEY_VAULT_URL",
)
