#!/bin/sh
# Real-GPU validation of libvgpu.so, in under 8 minutes on one NVIDIA GPU (no network): builds the library from this
# checkout and runs PyTorch, CuPy, JAX, Triton and transformers workloads under a grant. The last line printed is one
# JSON object. Exit status: 0 every check passed, 1 one failed, 3 no GPU here. What it does: validate.py's docstring.
#
#   benchmarks/gpu/validate.sh                      everything
#   benchmarks/gpu/validate.sh --only torch_caching,split_30_70 --limit-mib 4096
#   PYTHON=/opt/conda/bin/python benchmarks/gpu/validate.sh --keep /tmp/validate
set -u
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
    for candidate in python3 python; do
        if command -v "$candidate" >/dev/null 2>&1; then python=$candidate; break; fi
    done
fi
if [ -z "$python" ]; then
    echo "validate: no python3 on PATH (set PYTHON to the interpreter that has the frameworks)" >&2
    echo '{"gpu": null, "ok": false, "reason": "no python3"}'
    exit 3
fi
exec "$python" "$here/validate.py" "$@"
