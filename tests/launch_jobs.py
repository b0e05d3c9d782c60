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


class WhereAmI(RankJob):
    """What a rank finds when it starts: whether torch was already imported (a rank forked warm), its parent, the
    driver's environment and directory, and the preload a warm rank's start-up adds back."""

    def run(self) -> dict:
        import sys

        return {"torch_loaded": "torch" in sys.modules, "pid": os.getpid(), "ppid": os.getppid(),
                "probe": os.environ.get("PP_WARM_PROBE"), "cwd": os.getcwd(),
                "preload": os.environ.get("PP_WARM_PRELOAD_S")}  # fmt: skip


class Sleeps(RankJob):
    """Sleeps for two minutes: a rank to be killed."""

    def run(self) -> str:
        time.sleep(120)
        return "slept"
