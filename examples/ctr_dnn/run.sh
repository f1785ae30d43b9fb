#!/usr/bin/env bash
# The Quick start demo: generate Criteo-format data, train CTR-DNN with 1 parameter server
# and 2 workers on this machine (fleetrun), then print the test AUC of the saved model.
#
# Makes (or reuses) a virtual environment with fleet installed: $FLEET_VENV, default
# .venv at the repository root. Options after the script name go to train.py, e.g.
#   bash examples/ctr_dnn/run.sh --strategy geo --geo_k 50
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${FLEET_VENV:-$root/.venv}"
py="$venv/bin/python"
export NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-$venv/numba-cache}"

if ! "$py" -c "import fleet, numba, zmq" >/dev/null 2>&1; then
    echo "== installing fleet into $venv"
    python3 -m venv "$venv"
    "$py" -m pip install --quiet --disable-pip-version-check -e "$root" </dev/null
fi

cd "$here"
if [ ! -d data/train ]; then
    "$py" generate_data.py --out_dir data --train_lines 200000 --test_lines 50000
fi
rm -rf output
echo "== training: 1 server, 2 workers (logs in examples/ctr_dnn/output/log)"
"$py" -m fleet.launch --server_num 1 --worker_num 2 --log_dir output/log \
    train.py --data_dir data --model_dir output --epochs 1 "$@"
echo "== evaluating output/epoch_0 on data/test"
"$py" infer.py --model_dir output/epoch_0 --data_dir data
