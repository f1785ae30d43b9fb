"""Helper of tests/integration/test_online.py: the state online.py saved as a chain, next to
a full save of the same moment.

    python online_chain.py train FULL_DIR <online.py arguments>
        trains as online.py does (one local process), then saves every row (mode 0) to FULL_DIR
    python online_chain.py reload OUT_DIR <online.py arguments> --load SAVE
        builds the same model in a fresh process, loads the chain ending at
        <model_dir>/SAVE (load_persistables walks it back to its base), saves every row to OUT_DIR

Run from examples/ctr_dnn (online.py's imports).
"""
import os
import sys

import fleet
import online
from role_makers import PaddleCloudRoleMaker


def main():
    what, out = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    load = None
    if "--load" in rest:
        i = rest.index("--load")
        load, rest = rest[i + 1], rest[:i] + rest[i + 2:]
    args = online.parse_args(rest)
    fleet.init(PaddleCloudRoleMaker())
    inputs, avg_cost, predict, test_program = online.build(args)
    if what == "train":
        os.makedirs(args.model_dir, exist_ok=True)
        exe = online.run_worker(args, inputs, avg_cost, predict, test_program)
    else:
        exe = fleet.Executor()
        exe.run(fleet.startup_program)
        fleet.load_persistables(exe, os.path.join(args.model_dir, load))
    fleet.save_persistables(exe, out, mode=0)
    fleet.stop_worker()


if __name__ == "__main__":
    main()
