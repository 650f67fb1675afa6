"""The questions the GPU suite answers about MPS and per-cgroup GPU memory limits, by id.

A test names the questions it answers with `@pytest.mark.answers("<id>", ...)` and records its answer with
`report.answer(<id>, ...)`; the run writes every question, answered or with the reason it was not, to
gpu-answers.md beside the JSON report. tests/gpu/README.md lists them (a harness test keeps both in step).
"""

from __future__ import annotations

QUESTIONS: dict[str, str] = {
    # Tenant MPS (legacy daemon, as the chart runs it)
    "multiuser-flag": "Which spelling of the multi-user option does the installed nvidia-cuda-mps-control "
    "accept, and does the chart's daemon command (`-f -M`) start?",
    "shm-need": "Is a legacy MPS client served in its own IPC and mount namespace with a private /dev/shm "
    "(as a container runs), with and without the daemon's /dev/shm, and in its own pid namespace?",
    "uids-multiuser": "Under the multi-user daemon, do clients of two uids hold the GPU at the same time?",
    "uids-single": "Without multi-user, does a second uid's client wait until the first uid's client exits "
    "(NVIDIA's documented serialization)?",
    "poddir-client": "Is a client given only its pod's MPS directory (a hard link to `control`, as "
    "agent/mpsdaemon/pipedirs.py builds it) served by MPS?",
    "poddir-control": "Can a client holding only its pod's MPS directory send control commands (read, change "
    "a default, quit), as root and as another uid?",
    "exclusive-server": "With the GPU in EXCLUSIVE_PROCESS and an MPS server running, is a process without "
    "the pipe directory refused?",
    "exclusive-idle": "With the GPU in EXCLUSIVE_PROCESS and the daemon up but no server started yet, is a "
    "process without the pipe directory refused, and can MPS clients run after it?",
    "probe-real": "Does the agent's probe (agent/mpsdaemon/pipedirs.py) find the real daemon's "
    "control socket "
    "up?",
    "drain-neighbour": "With one busy MPS client ended through the daemon by the agent's drain "
    "(agent/mpsdaemon/drain.py) before SIGKILL, does a busy neighbour on the same server finish, and "
    "without the "
    "drain "
    "does it fail?",
    "watchdog-plain": "Does NVML's process list of an MPS GPU show a plain process (no pipe directory) and "
    "the daemon's client, and does the watchdog (agent/enforce/watchdog.py), told by the daemon's "
    "client list, "
    "end "
    "the plain process and leave the client and the server alone?",
    "share-usable": "How much can a client allocate on a `gpu-memory: 2Gi` share as gpupack sets its env, "
    "against the 2 048 - 514 MiB the docs promise?",
    "pinned-uuid": "Does `set_default_device_pinned_mem_limit` accept a GPU UUID (the agent sends UUIDs) "
    "and cap a client that sets no limit of its own?",
    # Enforced memory (driver r615+, cgroup v2)
    "hard-oom": "Does a hard limit on a leaf cgroup stop an MPS v3 client's allocations at the limit with "
    "CUDA_ERROR_OUT_OF_MEMORY?",
    "hard-nonmps": "Does the same hard limit hold for a process that is not an MPS client?",
    "leaf-total": "Does cuMemGetInfo report the leaf's hard limit as total memory?",
    "ns-threads": "Does an MPS v3 namespace's thread percentage override a client's "
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE?",
    "malformed-pinned": "Does a malformed client CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (an entry for a GPU it "
    "cannot see) escape the cgroup hard limit, as it escapes the namespace's pinned limit?",
    "soft-evict": "Is an over-soft client evicted (CUDA_ERROR_MPS_CLIENT_TERMINATED) when a within-soft "
    "client needs the memory?",
}
