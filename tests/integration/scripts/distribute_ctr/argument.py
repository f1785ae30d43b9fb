"""Command-line options of the CTR-DNN example (PaddleFleetX examples/distribute_ctr)."""
import argparse


def params_args(args=None):
    """Parses the options (``args``: a list, default sys.argv)."""
    params = argparse.ArgumentParser(description="Trains CTR-DNN, locally or distributed.")
    params.add_argument("--name", type=str, default="ctr-dnn", help="model name")
    params.add_argument("--train_files_path", type=str, default="raw_data", help="directory of Criteo train files")
    params.add_argument("--test_files_path", type=str, default="test_data", help="directory of Criteo test files")
    params.add_argument("--log_path", type=str, default="result")
    params.add_argument("--model_path", type=str, default="model")
    params.add_argument("-l", "--learning_rate", type=float, default=1e-4)
    params.add_argument("-b", "--batch_size", type=int, default=1000)
    params.add_argument("-e", "--epochs", type=int, default=1)
    params.add_argument("--embedding_size", type=int, default=10)
    params.add_argument("--sparse_feature_dim", type=int, default=1000001)
    params.add_argument("--dense_feature_dim", type=int, default=13)
    params.add_argument("--is_sparse", type=bool, default=True)
    params.add_argument("--sync_mode", type=str, required=False, choices=["sync", "half_async", "async", "geo_async"])
    params.add_argument("--cpu_num", type=int, default=2)
    params.add_argument("--cloud", type=int, default=0, help="1 when the cluster gives each node its files")
    params.add_argument("--test", type=int, default=0, help="1: the first worker saves the model every epoch")
    return params.parse_args(args)
