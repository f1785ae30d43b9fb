"""An InMemoryDataset job of 1 server and 2 workers whose Paddle 1.x script calls
``dataset.global_shuffle(fleet)`` with the imported ``fleet`` package (a script that
passed the package, not fleet's own object, was refused): the workers exchange examples,
none is lost or doubled, and each trains what it received."""
import json
import os
import re

import numpy as np

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "in_memory_shuffle.py")


def _write(path, n, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for x in rng.normal(size=(n, 4)):
            f.write("4 " + " ".join(f"{v:.4f}" for v in x) + f" 1 {int(x.sum() > 0)}\n")


def test_global_shuffle_with_the_fleet_package_moves_examples_between_real_workers(fleetrun, tmp_path):
    files = [tmp_path / "part-0", tmp_path / "part-1"]
    _write(files[0], 300, 1)
    _write(files[1], 100, 2)
    result = fleetrun("--server_num", 1, "--worker_num", 2, "--log_dir", tmp_path / "log", SCRIPT,
                      ",".join(map(str, files)), timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    out = {}
    for i in range(2):
        with open(tmp_path / "log" / f"workerlog.{i}") as f:
            log = f.read()
        line = json.loads([x for x in log.splitlines() if x.startswith("{")][-1])
        trained = re.search(r"pass done: (\d+) examples", log)
        assert trained and int(trained.group(1)) == line["after"], log[-2000:]
        out[line["worker"]] = line
    assert [out[0]["before"], out[1]["before"]] == [300, 100]  # split_files: one file each
    assert out[0]["after"] + out[1]["after"] == 400
    assert 130 < out[0]["after"] < 270, out  # a random half of 400 (the binomial's 7 sigma)
    assert {o["memory_total"] for o in out.values()} == {o["shuffle_total"] for o in out.values()} == {400}
