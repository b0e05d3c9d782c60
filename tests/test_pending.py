"""Which pending reasons the driver waits for and which end a job (launch/pending.py), on SLURM's reason strings as
`scontrol show job` gives them. The watchdog on the testbed's daemons (EnforcePartLimits=NO):
tests/test_slurm_faults.py."""

from __future__ import annotations

import pytest
from pretrain_planner.launch.pending import never_clears, stuck_message

SETTINGS = {"gpu_type": "h100", "site": "my-site.yaml", "partition": "short"}


@pytest.mark.parametrize("reason", ["Priority", "Resources", "QOSMaxJobsPerUserLimit", "ReqNodeNotAvail, May be "
                                    "reserved for other job", "BeginTime", "Dependency", "None", "", None])  # fmt: skip
def test_reasons_that_clear_are_waited_for(reason):
    assert not never_clears(reason)


@pytest.mark.parametrize(("reason", "says", "fix"), [
    ("PartitionTimeLimit", "above the partition's MaxTime", "gpus.h100.time_limit_min in my-site.yaml"),
    ("JobHeldAdmin", "an administrator holds it", "administrators"),
    ("launch_failed_requeued_held", "its launch failed", "slurmd's log"),
    ("InvalidAccount", "account does not exist", "gpus.h100.account in my-site.yaml"),
    ("InvalidQOS", "QOS does not exist", "gpus.h100.qos in my-site.yaml"),
    ("DependencyNeverSatisfied", "can never start", "run again"),
])  # fmt: skip
def test_reasons_that_never_clear_end_the_job_naming_the_fix(reason, says, fix):
    assert never_clears(reason)
    text = stuck_message("42", reason, SETTINGS)
    assert text.startswith(f"job 42 pended with reason {reason} on short: ") and says in text and fix in text, text
