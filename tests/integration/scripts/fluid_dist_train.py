"""The "distributed training quick start" script of Paddle 1.x's manual (dist_train.py:
fluid.DistributeTranspiler, roles from PADDLE_TRAINING_ROLE, PADDLE_PSERVER_IPS,
PADDLE_PSERVER_PORT, PADDLE_TRAINERS, PADDLE_CURRENT_IP, PADDLE_TRAINER_ID), run by
tests/integration/test_fluid_transpiler.py.

Changed from the manual: the import; the data (paddle.dataset.uci_housing, which needs a
download, becomes 64 generated housing-like examples, shuffled per trainer with
paddle.reader.shuffle's role played by a seeded permutation); FLUID_SYNC=0 passes
sync_mode=False to transpile; each trainer writes its losses and parameters to
FLUID_OUT for the test (trainer 0 also saves its persistables and an inference model there with
fluid.io);
PADDLE_TRAINING_ROLE=LOCAL trains one process on both trainers'
batches together (the test's reference, not in the manual).
"""
import json
import os

import numpy as np

import fleet.fluid as fluid

# train reader
BATCH_SIZE = 20
EPOCH_NUM = 30
BATCH_SIZE = 8

_rng = np.random.default_rng(0)
_X = _rng.normal(size=(64, 13)).astype("float32")
_Y = (_X @ _rng.normal(size=(13, 1)) + 0.5 + 0.1 * _rng.normal(size=(64, 1))).astype("float32")


def housing_reader(seed):
    """Batches of (x, y) samples in a new order every epoch, fixed by seed (what
    paddle.batch(paddle.reader.shuffle(uci_housing.train(), ...), BATCH_SIZE) gives)."""
    epochs = iter(range(10 ** 6))

    def reader():
        order = np.random.default_rng([seed, next(epochs)]).permutation(len(_X))
        for start in range(0, len(order), BATCH_SIZE):
            yield [(_X[i], _Y[i]) for i in order[start:start + BATCH_SIZE]]
    return reader


train_reader = housing_reader(int(os.getenv("PADDLE_TRAINER_ID", "0")))


def train():
    y = fluid.layers.data(name='y', shape=[1], dtype='float32')
    x = fluid.layers.data(name='x', shape=[13], dtype='float32')
    y_predict = fluid.layers.fc(input=x, size=1, act=None)

    loss = fluid.layers.square_error_cost(input=y_predict, label=y)
    avg_loss = fluid.layers.mean(loss)
    opt = fluid.optimizer.SGD(learning_rate=0.001)
    opt.minimize(avg_loss)
    fluid.default_startup_program().random_seed = 1  # every process starts from the same values

    place = fluid.CPUPlace()
    feeder = fluid.DataFeeder(place=place, feed_list=[x, y])
    exe = fluid.Executor(place)

    # fetch distributed training environment setting
    training_role = os.getenv("PADDLE_TRAINING_ROLE", None)
    port = os.getenv("PADDLE_PSERVER_PORT", "6174")
    pserver_ips = os.getenv("PADDLE_PSERVER_IPS", "")
    trainer_id = int(os.getenv("PADDLE_TRAINER_ID", "0"))
    eplist = []
    for ip in pserver_ips.split(","):
        eplist.append(':'.join([ip, port]))
    pserver_endpoints = ",".join(eplist)
    trainers = int(os.getenv("PADDLE_TRAINERS"))
    current_endpoint = os.getenv("PADDLE_CURRENT_IP", "") + ":" + port
    out_dir = os.environ["FLUID_OUT"]

    def record(tag, losses):
        scope = fluid.global_scope()
        np.savez(os.path.join(out_dir, tag + ".npz"), w=scope["fc_0.w_0"], b=scope["fc_0.b_0"])
        with open(os.path.join(out_dir, tag + ".json"), "w") as f:
            json.dump({"losses": losses}, f)

    if training_role == "LOCAL":
        exe.run(fluid.default_startup_program())
        losses = []
        readers = [housing_reader(0), housing_reader(1)]
        for epoch in range(EPOCH_NUM):
            for part0, part1 in zip(readers[0](), readers[1]()):
                avg_loss_value, = exe.run(fluid.default_main_program(), feed=feeder.feed(part0 + part1),
                                          fetch_list=[avg_loss])
                losses.append(float(avg_loss_value[0]))
        record("local", losses)
        return

    t = fluid.DistributeTranspiler()
    t.transpile(
        trainer_id=trainer_id,
        pservers=pserver_endpoints,
        trainers=trainers,
        sync_mode=os.getenv("FLUID_SYNC", "1") == "1")

    if training_role == "PSERVER":
        pserver_prog = t.get_pserver_program(current_endpoint)
        startup_prog = t.get_startup_program(current_endpoint, pserver_prog)
        exe.run(startup_prog)
        exe.run(pserver_prog)
        print("pserver %s done" % current_endpoint, flush=True)
    elif training_role == "TRAINER":
        trainer_prog = t.get_trainer_program()
        exe.run(fluid.default_startup_program())

        losses = []
        for epoch in range(EPOCH_NUM):
            for batch_id, batch_data in enumerate(train_reader()):
                avg_loss_value, = exe.run(trainer_prog,
                                          feed=feeder.feed(batch_data),
                                          fetch_list=[avg_loss])
                losses.append(float(avg_loss_value[0]))
                if (batch_id + 1) % 10 == 0:
                    print("Epoch: {0}, Batch: {1}, loss: {2}".format(
                        epoch, batch_id, avg_loss_value[0]))
        record("trainer%d" % trainer_id, losses)
        if trainer_id == 0:  # not in the manual: saves through fluid.io, read back by the test
            fluid.io.save_persistables(exe, os.path.join(out_dir, "saved"), trainer_prog)
            fluid.io.save_inference_model(os.path.join(out_dir, "model"), ["x"], [y_predict], exe, trainer_prog)
        # destory the resource of current trainer node in pserver server node
        exe.close()
    else:
        raise AssertionError("PADDLE_TRAINING_ROLE should be one of [TRAINER, PSERVER]")


train()
