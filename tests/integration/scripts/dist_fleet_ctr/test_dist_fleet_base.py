"""The runner base of Paddle's dist_fleet_* test scripts (FleetDistRunnerBase and
runtime_main), rebuilt for fleet: a script's TestDistCTR2x2 defines ``net`` and
``do_dataset_training``; ``runtime_main`` builds the role, strategy, network and
optimizer and runs the server or the trainer.

As in Paddle, ``--role pserver|trainer --endpoints ... --current_id N --trainers N`` make
the role with UserDefinedRoleMaker. Without ``--role`` the role comes from Paddle's
environment variables (PaddleCloudRoleMaker): so fleetrun can start the script, and alone
it trains locally.
"""
from __future__ import print_function

import argparse
import os

import fleet.fluid as fluid
import role_makers as role_maker
import fleet
from strategies import StrategyFactory

__all__ = ["FleetDistRunnerBase", "runtime_main"]

RUN_STEP = 5
LEARNING_RATE = 0.01


class FleetDistRunnerBase(object):
    """net: the model (child classes); do_dataset_training: the trainer's work."""

    def build_role(self, args):
        if args.role is None:
            return role_maker.PaddleCloudRoleMaker()
        if args.role.upper() == "PSERVER":
            return role_maker.UserDefinedRoleMaker(current_id=args.current_id, role=role_maker.Role.SERVER,
                                                   worker_num=args.trainers,
                                                   server_endpoints=args.endpoints.split(","))
        return role_maker.UserDefinedRoleMaker(current_id=args.current_id, role=role_maker.Role.WORKER,
                                               worker_num=args.trainers, server_endpoints=args.endpoints.split(","))

    def build_strategy(self, args):
        self.strategy = None
        if args.mode == "async":
            self.strategy = StrategyFactory.create_async_strategy()
        elif args.mode == "sync":
            self.strategy = StrategyFactory.create_sync_strategy()
        elif args.mode == "half_async":
            self.strategy = StrategyFactory.create_half_async_strategy()
        elif args.mode == "geo":
            self.strategy = StrategyFactory.create_geo_strategy(args.geo_sgd_need_push_nums)
        return self.strategy

    def build_optimizer(self, avg_cost, strategy):
        optimizer = fluid.optimizer.SGD(LEARNING_RATE)
        optimizer = fleet.distributed_optimizer(optimizer, strategy)
        optimizer.minimize(avg_cost)

    def run(self, args):
        fleet.init(self.build_role(args))
        strategy = self.build_strategy(args)
        avg_cost = self.net(args)
        self.build_optimizer(avg_cost, strategy)
        if fleet.is_server():
            fleet.init_server()
            fleet.run_server()
        else:
            self.do_dataset_training(fleet)

    def net(self, args, batch_size=4, lr=0.01):
        raise NotImplementedError("net should be implemented by child classes.")

    def do_dataset_training(self, fleet):
        raise NotImplementedError("do_dataset_training should be implemented by child classes.")


def runtime_main(test_class):
    parser = argparse.ArgumentParser(description="Run Fleet test.")
    parser.add_argument("--role", type=str, required=False, default=None, choices=["pserver", "trainer"])
    parser.add_argument("--endpoints", type=str, required=False, default="")
    parser.add_argument("--current_id", type=int, required=False, default=0)
    parser.add_argument("--trainers", type=int, required=False, default=1)
    parser.add_argument("--mode", type=str, required=False, default="geo")
    parser.add_argument("--geo_sgd_need_push_nums", type=int, required=False, default=2)
    parser.add_argument("--reader", type=str, required=False, default="dataset", choices=["dataset"])
    args = parser.parse_args()
    test_class().run(args)
