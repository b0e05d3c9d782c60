"""Small jobs for the launcher's tests (importable by a rank process started from the repository root)."""

from __future__ import annotations

import os
import time

from pretrain_planner.launch.rankjob import RankJob


class OneRankDies(RankJob):
    """Rank 1 dies without a result (like a SIGKILL); rank 0 would wait for it for two minutes."""

    def run(self) -> str:
        if os.environ.get("SUBMITIT_LOCAL_GLOBALID") == "1":
            time.sleep(1)
            os._exit(3)
        time.sleep(120)
        return "rank 0 waited to the end"
