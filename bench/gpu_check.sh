#!/usr/bin/env bash
# The GPU check in one command: SFT step speed, MFU and memory at a real model's shapes, the loss's
# teacher side, the bf16 error of lp, lq and w_t, evaluate.py and rl.py on the toy task, and one
# summary table (bench/gpu_check.py says what and how). --out gets three files: summary.md,
# summary.json (both rewritten after every part), logs.tar.gz.
#   bash bench/gpu_check.sh [--out out/gpu_check] [--shape qwen2.5-1.5b] ...
#                                             one GPU, inside 9 minutes
#   bash bench/gpu_check.sh --smoke           tiny shapes, CPU is enough (the test)
#   bash bench/gpu_check.sh --fetch_wheels    on a machine with PyPI: math-verify and what it needs,
#                                             as wheels in .whl/
# The GPU image lacks math-verify (evaluate.py and rl.py import it): when .whl/ holds wheels, they
# are installed into a temporary folder put on PYTHONPATH first. With the device tool: carry
# [".whl"], command `bash bench/gpu_check.sh --out $OUT/gpu_check`; the CUDA tests:
# `python -m pytest -m gpu` (after installing .whl/).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x .venv/bin/python ]; then py=.venv/bin/python
else py=python3
fi

if [ "${1:-}" = "--fetch_wheels" ]; then
  # math-verify 0.9.0 (requirements.txt) requires latex2sympy2_extended==1.11.0, which requires
  # sympy (torch has it) and antlr4-python3-runtime>=4.9.3,<=4.13.2; all three: pure-Python wheels
  exec "$py" -m pip download --no-deps -d .whl math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
    antlr4-python3-runtime==4.13.2
fi

site=""
if compgen -G ".whl/*.whl" >/dev/null; then
  site=$(mktemp -d /tmp/gpu_check_site.XXXXXX)
  "$py" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  echo "installed $(ls .whl | tr '\n' ' ')into $site"
fi
rc=0
"$py" bench/gpu_check.py "$@" || rc=$?
[ -z "$site" ] || rm -rf "$site"
exit $rc
