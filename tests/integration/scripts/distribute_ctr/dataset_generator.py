"""Raw Criteo lines on stdin -> MultiSlot text for ``dataset.set_pipe_command``: the 13
dense features normalised, each of the 26 categorical features hashed with its column
index into ``hash_dim_`` ids, and the label.

The hash is CRC32 of the column index and the text: Python 3's ``hash`` of a string
differs from process to process, so workers would disagree on the ids."""
import zlib

import fleet.data_generator as dg

cont_min_ = [0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
cont_diff_ = [20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50]
hash_dim_ = 1000001
continuous_range_ = range(1, 14)
categorical_range_ = range(14, 40)


class DacDataset(dg.MultiSlotDataGenerator):
    """Reads Criteo lines (label, I1..I13, C1..C26, tab-separated)."""

    def generate_sample(self, line):
        def reader():
            features = line.rstrip("\n").split("\t")
            dense_feature = [0.0 if features[idx] == "" else
                             (float(features[idx]) - cont_min_[idx - 1]) / cont_diff_[idx - 1]
                             for idx in continuous_range_]
            sparse_feature = [[zlib.crc32((str(idx) + features[idx]).encode()) % hash_dim_]
                              for idx in categorical_range_]
            names = ["dense_feature"] + ["C" + str(idx - 13) for idx in categorical_range_] + ["label"]
            yield list(zip(names, [dense_feature] + sparse_feature + [[int(features[0])]]))

        return reader


if __name__ == "__main__":
    DacDataset().run_from_stdin()
