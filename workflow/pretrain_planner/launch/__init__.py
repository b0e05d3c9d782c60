"""Launching (the driver, no torch): jobs on SLURM or this host, re-attached after a restart, one driver per
results folder, devices held alone, requeues that must make progress, and each job's per-rank callable."""
