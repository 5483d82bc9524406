"""After the last shard: a job's own analysis (reduce), the jobs that start after it (chains), and the
notifications about it. Everything here starts from the job-done transition that upwell.results.publish
sees exactly once (``hook.job_done``), or from the ingest of a manifest that names ``after:``
(``chains.gate``); the state it keeps lives on the job row, changed under its ETag (``state``)."""
