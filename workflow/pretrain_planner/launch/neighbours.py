"""Who else is on a cell's node: a measurement is only as honest as its node was quiet. Unless a job asks a node of its
own (`extra_sbatch: {exclusive: true}`), SLURM places other users' jobs beside it, and steady contention for cores,
memory bandwidth or PCIe does not show in the spread check (which catches jitter). So each rank records the cores it
may use, and the first rank on each node asks the controller which other jobs run there when it starts and when it
ends (`squeue -w NODE`: one call per node, twice per cell). The driver then marks a cell measured beside other jobs
`noisy` (kept out of the pick), naming them, unless the site file says its nodes are shared by design
(`shared_nodes: true`: the jobs are then recorded only). Imports no torch.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from pretrain_planner.launch.rankjob import job_id_here, local_rank
from pretrain_planner.launch.slurm_state import run_cmd


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def other_jobs(node: str, mine: str | None) -> list[dict[str, str]] | None:
    """The jobs running on `node` besides `mine` (id, user, name); None where the controller cannot be asked."""
    rc, out, _ = run_cmd(["squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING", "-o", "%i|%u|%j"])
    if rc != 0:
        return None
    jobs = []
    for line in out.splitlines():
        jid, _, rest = line.strip().partition("|")
        user, _, name = rest.partition("|")
        if jid and jid != mine and jid.split("_")[0] != mine:
            jobs.append({"job_id": jid, "user": user, "name": name})
    return jobs


def look() -> dict[str, Any]:
    """This rank's node and cores, and (the first rank of a node, in a SLURM job) the other jobs on its node."""
    seen: dict[str, Any] = {"node": node_name(), "cores": sorted(os.sched_getaffinity(0))}
    job = os.environ.get("SLURM_JOB_ID")
    if job and local_rank() == 0:
        seen["others"] = other_jobs(seen["node"], job_id_here())
    return seen


def placement(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """What a rank returns: its node and cores, and the other jobs on its node at its start and end."""
    out = {"node": start["node"], "cores": start["cores"]}
    if "others" in start or "others" in end:
        out["others_start"], out["others_end"] = start.get("others"), end.get("others")
    return out


def co_tenants(placements: list[dict[str, Any]]) -> list[str]:
    """Every other job seen on the cell's nodes, once each: "JOB (USER, NAME) on NODE"."""
    seen = []
    for p in placements:
        for other in (p.get("others_start") or []) + (p.get("others_end") or []):
            text = f"{other['job_id']} ({other['user']}, {other['name']}) on {p['node']}"
            if text not in seen:
                seen.append(text)
    return seen


def judge(result: dict[str, Any], placements: list[dict[str, Any]], shared_by_design: bool) -> dict[str, Any]:
    """The result with its placement recorded; an `ok` cell measured beside other jobs becomes `noisy`, naming
    them (kept out of the pick), unless the site's nodes are shared by design."""
    others = co_tenants(placements)
    unknown = any(p.get("others_start") is None and "others_start" in p for p in placements)
    result = {**result, "placement": {"ranks": placements, "co_tenants": others, "shared_by_design": shared_by_design,
                                      "unknown": unknown}}  # fmt: skip
    if others and not shared_by_design and result.get("status") == "ok":
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        result["status"] = "noisy"
        result["reason"] = (f"measured beside other jobs on its node(s): {'; '.join(others[:3])}{more}: its step time "
                            "may include their load. Ask a node of its own (extra_sbatch: {exclusive: true} in the "
                            "site file) and run it again, or set shared_nodes: true where nodes are shared by "
                            "design")  # fmt: skip
    return result
