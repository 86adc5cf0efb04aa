"""What bench/torch_step.py and bench/torch_gpt.py share: the BLAS library torch loaded,
and the --serve loop hearsay-bench drives (bench/torch_server.h)."""
import json
import os
import sys
import time


def blas_library():
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "blas" in line}
    return ",".join(sorted(os.path.realpath(l) for l in libs)) or "unknown"


def serve(step, device="cpu", **announce):
    """Announce readiness (with `announce`'s fields), then answer each line "N" on stdin
    with the seconds N calls of step() took, so the two programs' rounds interleave. On a
    GPU the clock stops once the device has finished the steps (as hearsay-bench's does)."""
    import torch
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    print(json.dumps({"ready": True, "torch": torch.__version__, "blas": blas_library(), "device": str(device),
                      **announce}, separators=(",", ":")), flush=True)
    for line in sys.stdin:
        n = int(line)
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        print(time.perf_counter() - t0, flush=True)
