#!/usr/bin/env bash
# Quick start on a fresh machine:  bash run.sh        (install, then the CPU demo: 9 min, 2 cores)
#                                  bash run.sh test   (install, then the tests)
#                                  bash run.sh bench  (install, then the loss benchmark)
set -euo pipefail
cd "$(dirname "$0")"
venv=${VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -r requirements.txt
case "${1:-demo}" in
  test) shift || true; exec "$venv/bin/python" -m pytest -q "$@" ;;
  demo) "$venv/bin/python" demo/run.py --size full --out out/demo
        exec "$venv/bin/python" demo/decisive_token.py --demo out/demo ;;
  bench) exec "$venv/bin/python" bench/loss_speed.py ;;
  *) echo "usage: bash run.sh [demo|test [pytest args]|bench]" >&2; exit 2 ;;
esac
