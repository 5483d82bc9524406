"""``python -m tests.faults.stalled_ingest [devhost options]``: the devhost with only its ingest function
(no agents start, nothing re-drives), whose ingest stalls for good.

The enqueue's test seam (``upwell.ingest.accept.SEND_HOOK``) waits ``UPWELL_TEST_SEND_DELAY_S`` before each
work item, and stops at item ``UPWELL_TEST_STALL_AT``: it touches the file ``UPWELL_TEST_STALL_MARK`` and
never returns, so the ingest stops renewing its lease, as on a host that crashed half-way. The fault test
then kills this host (SIGKILL).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from upwell.ingest import accept
from upwell.local.devhost.__main__ import main


def stall(index: int) -> None:
    if index >= int(os.environ["UPWELL_TEST_STALL_AT"]):
        Path(os.environ["UPWELL_TEST_STALL_MARK"]).touch()
        threading.Event().wait()  # never set: this host is killed while it waits
    time.sleep(float(os.environ["UPWELL_TEST_SEND_DELAY_S"]))


if __name__ == "__main__":
    accept.SEND_HOOK = stall
    sys.exit(main([*sys.argv[1:], "--functions", "ingest"]))
