#!/usr/bin/env bash
# The device checks of one GPU session, in one call of the device tool (under 9 minutes):
#   bash bench/gpu_session.sh [tests] [b12] [b8] [start] [ctx] [profile]   (no argument: all)
# Results under $OUT (the device tool's folder), else bench/results. The device's python3 has
# torch + CUDA but not this venv: src goes on PYTHONPATH.
set -u
OUT=${OUT:-bench/results}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
steps=${*:-tests b12 b8 start ctx profile}
log=$OUT/gpu_session.log
want() { [[ " $steps " == *" $1 "* ]]; }
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  if want tests; then
    echo "== CUDA batch tests"
    timeout 80 python3 -m pytest -q -p no:cacheprovider -x tests/data/test_torch_batches_device_cuda.py tests/data/test_torch_batches_device.py
    echo "rc=$?"
  fi
  if want b12; then
    echo "== B12 checkpoint_state_gpu"
    timeout 300 python3 bench/checkpoint_state_gpu.py --out "$OUT/checkpoint_state_gpu"
    echo "rc=$?"
  fi
  if want b8; then
    echo "== B8 ingest_device cuda"
    timeout 100 python3 bench/ingest_device.py --device cuda --reps 3 --out "$OUT/ingest_device_cuda"
    echo "rc=$?"
  fi
  if want start; then
    echo "== cuda_start"
    timeout 60 python3 bench/cuda_start.py --systems fork_clean,auto,spawn_each,forced_fork --out "$OUT/cuda_start"
    echo "rc=$?"
  fi
  if want ctx; then
    echo "== CUDA context in a fresh worker-like process: the floor under a GPU worker's first line"
    timeout 60 python3 -c "
import os, time, torch
def ctx(label):
    t0 = time.perf_counter(); torch.cuda.set_device(0); torch.zeros(1, device='cuda')
    torch.cuda.synchronize(); print(label, f'{time.perf_counter() - t0:.3f} s', flush=True)
for i in range(2):
    pid = os.fork()
    if pid == 0:
        ctx(f'forked child {i} (torch imported, CUDA untouched): set_device + first tensor'); os._exit(0)
    os.waitpid(pid, 0)
ctx('parent: set_device + first tensor')"
    echo "rc=$?"
  fi
  if want profile; then
    echo "== ingest_device_profile cuda"
    timeout 60 python3 bench/ingest_device_profile.py --device cuda
    echo "rc=$?"
  fi
  date -u
} 2>&1 | tee "$log"
