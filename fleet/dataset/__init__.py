"""Datasets: DatasetFactory, QueueDataset and InMemoryDataset (Paddle Fleet 1.x's API).

Files are read by producer threads and parsed by numba kernels (MultiSlot text, or raw
Criteo lines with ``set_data_format("criteo")``) into batches for
``Executor.train_from_dataset``.
"""
from fleet.dataset.dataset import DatasetBase, DatasetFactory, InMemoryDataset, QueueDataset

__all__ = ["DatasetBase", "DatasetFactory", "InMemoryDataset", "QueueDataset"]
