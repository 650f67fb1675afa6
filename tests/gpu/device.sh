#!/usr/bin/env bash
# The GPU suite as ONE command on a lent GPU machine (the device tool: root, no network, repo root as cwd,
# results under $OUT, at most 8 files back). See tests/gpu/README.md, "On a lent GPU machine".
#
#   bash tests/gpu/device.sh            # budget: $GPUPACK_GPU_BUDGET_S seconds (default 500)
#
# Runs the tenancy and memory-limit questions first, then the rest of tests/gpu, and leaves in $OUT:
#   gpu-answers.md     every question of the suite with its answer, or why it was not answered
#   gpu-report.json    facts, measurements, per-test outcomes
#   gpu-pytest.log     pytest -v output
#   gpu-files.tar.gz   junit XML, nvidia-smi -q, host facts (kernel, cgroups, dmem, MPS binary), MPS logs
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:=/tmp/gpu-results}"
mkdir -p "$OUT"
work=/tmp/gpupack-gpu-work
rm -rf "$work" && mkdir -p "$work"
export GPUPACK_GPU_REPORT="$work/gpu-report.json" PYTHONUNBUFFERED=1

# The MPS control binary ships with the driver's user-space tools; images keep it in different places.
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  for d in /usr/local/nvidia/bin /usr/bin /opt/nvidia/bin /usr/local/cuda/bin; do
    [[ -x "$d/nvidia-cuda-mps-control" ]] && export PATH="$PATH:$d" && break
  done
fi
{
  echo "date: $(date -u +%FT%TZ)"; echo "kernel: $(uname -r)"; echo "id: $(id)"
  echo "python3: $(command -v python3) $(python3 --version 2>&1)"
  echo "mps binary: $(command -v nvidia-cuda-mps-control || echo none)"
  echo "/sys/fs/cgroup: $(stat -fc %T /sys/fs/cgroup 2>&1)"
  echo "cgroup.controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>&1)"
  echo "cgroup.subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control 2>&1)"
  echo "dmem.capacity: $(cat /sys/fs/cgroup/dmem.capacity 2>&1)"
  echo "own cgroup: $(grep '^0::' /proc/self/cgroup)"
  echo "unshare: $(unshare --ipc --mount true 2>&1 && echo ok)"
  echo "--- nvidia-cuda-mps-control -h"; timeout 10 nvidia-cuda-mps-control -h 2>&1 | head -40
  echo "--- python3 -m pip list (suite-relevant)"
  python3 -m pip list 2>/dev/null | grep -iE 'pytest|pydantic|nvidia-ml|yaml|prometheus|typing|torch|cupy'
} >"$work/host.txt" 2>&1

# SIGINT at the budget: pytest still finishes its session and writes the report and answers.
# Files named one by one: pytest folds a file into a folder named beside it, losing the order.
tests="tests/gpu/test_gpu_tenancy.py tests/gpu/test_gpu_memlimits.py"
tests+=" $(find tests/gpu -maxdepth 1 -name 'test_gpu_*.py' ! -name '*tenancy*' ! -name '*memlimits*' | sort | tr '\n' ' ')"
GPUPACK_GPU_TESTS="$tests" timeout -s INT -k 30 "${GPUPACK_GPU_BUDGET_S:-500}" \
  tests/gpu/run.sh --timeout 150 "$@"
rc=$?
cp "$work"/gpu-answers.md "$work"/gpu-report.json "$work"/gpu-pytest.log "$OUT"/ 2>/dev/null
tar -czf "$OUT/gpu-files.tar.gz" -C "$work" . 2>/dev/null
# The answers' headlines once more at the very end, so the tool's output tail carries them even if no file
# comes back.
grep -E '^## |^- \*\*|^- not answered|^- test .* (failed|skipped)' "$work/gpu-answers.md" 2>/dev/null | cut -c1-300
echo "[gpu] exit $rc; answers: $OUT/gpu-answers.md"
exit "$rc"
