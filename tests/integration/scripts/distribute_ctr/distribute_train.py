"""CTR-DNN trained with Fleet (PaddleFleetX examples/distribute_ctr), locally or as a
parameter server or worker. Only the imports differ from the Paddle 1.x script:

    import fleet.fluid as fluid                      # paddle.fluid
    import role_makers as role_maker                 # paddle.fluid.incubate.fleet.base.role_maker
    import fleet                                     # ...parameter_server.distribute_transpiler.fleet
    from strategies import DistributeTranspilerConfig

(``fleet.save_persistables`` saves the model, as FleetX's distribute_base does).
``--sync_mode geo_async`` is FleetX's
GEO-SGD setting (geo_sgd_mode, 400 steps between pushes).
"""
from __future__ import print_function

import logging
import os
import time

import fleet.fluid as fluid
import role_makers as role_maker
import fleet
from strategies import DistributeTranspilerConfig
from network import CTR
from argument import params_args

logging.basicConfig(format="%(asctime)s - %(levelname)s - %(message)s")
logger = logging.getLogger("fluid")
logger.setLevel(logging.INFO)


def get_dataset(inputs, params):
    dataset = fluid.DatasetFactory().create_dataset()
    dataset.set_use_var(inputs)
    dataset.set_pipe_command("python dataset_generator.py")
    dataset.set_batch_size(params.batch_size)
    dataset.set_thread(int(params.cpu_num))
    file_list = [str(params.train_files_path) + "/%s" % x for x in os.listdir(params.train_files_path)]
    # every worker must read different files: when nodes are simulated locally, split them
    if not int(params.cloud):
        file_list = fleet.split_files(file_list)
    dataset.set_filelist(file_list)
    logger.info("file list: {}".format(file_list))
    return dataset


def train(params):
    role = role_maker.PaddleCloudRoleMaker()
    fleet.init(role)

    strategy = DistributeTranspilerConfig()
    if params.sync_mode == "sync":
        strategy.sync_mode = True
    elif params.sync_mode == "async":
        strategy.sync_mode = False
        strategy.runtime_split_send_recv = True
    elif params.sync_mode == "geo_async":
        strategy.sync_mode = False
        strategy.runtime_split_send_recv = True
        strategy.geo_sgd_mode = True
        strategy.geo_sgd_need_push_nums = 400

    ctr_model = CTR()
    inputs = ctr_model.input_data(params)
    avg_cost, auc_var, batch_auc_var = ctr_model.net(inputs, params)
    optimizer = fluid.optimizer.Adam(params.learning_rate)
    optimizer = fleet.distributed_optimizer(optimizer, strategy)
    optimizer.minimize(avg_cost)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
    elif fleet.is_worker():
        fleet.init_worker()
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(fleet.startup_program)
        dataset = get_dataset(inputs, params)
        for epoch in range(params.epochs):
            start_time = time.time()
            exe.train_from_dataset(program=fleet.main_program, dataset=dataset, fetch_list=[auc_var],
                                   fetch_info=["Epoch {} auc ".format(epoch)], print_period=100, debug=False)
            logger.info("epoch %d finished, use time=%d\n" % (epoch, time.time() - start_time))
            if params.test and fleet.is_first_worker():
                model_path = str(params.model_path) + "/" + "epoch_" + str(epoch)
                fleet.save_persistables(executor=exe, dirname=model_path)
        fleet.stop_worker()
        logger.info("Distribute Train Success!")


if __name__ == "__main__":
    params = params_args()
    train(params)
