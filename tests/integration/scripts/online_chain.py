"""Helper of tests/integration/test_online.py: the state online.py saved as a chain, next to
a full save of the same moment. Run under fleetrun from examples/ctr_dnn (online.py's
imports):

    online_chain.py train FULL_DIR <online.py arguments>
        trains as online.py does, then the worker saves every row (mode 0) to FULL_DIR
    online_chain.py reload OUT_DIR <online.py arguments>
        the servers load the last save online.py recorded (fleet.init_server walks its chain
        back to the base), and the worker saves every row to OUT_DIR without training
"""
import os
import sys

import fleet
import online
from role_makers import PaddleCloudRoleMaker


def main():
    what, out, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    args = online.parse_args(rest)
    fleet.init(PaddleCloudRoleMaker())
    inputs, avg_cost, predict, test_program = online.build(args)
    if fleet.is_server():
        save = online.read_progress(args.model_dir)["save"]
        online.serve(args, os.path.join(args.model_dir, save) if save and what == "reload" else None)
        return
    fleet.init_worker()
    if what == "train":
        exe = online.run_worker(args, inputs, avg_cost, predict, test_program)
    else:
        exe = fleet.Executor()
        exe.run(fleet.startup_program)
    fleet.save_persistables(exe, out, mode=0)
    fleet.stop_worker()


if __name__ == "__main__":
    main()
