"""Raw Criteo lines -> MultiSlot text, for ``dataset.set_pipe_command``.

    dataset.set_pipe_command("python dataset_generator.py")

Reads Criteo lines on stdin and writes, per example, the 28 slots of CTR-DNN's inputs:
dense_input (13 normalised floats), C1..C26 (one hashed id each) and label. The
normalisation and the hash are the ones ``set_data_format("criteo")`` uses, so both
paths give the same ids.
"""
import sys

from fleet.data_generator import MultiSlotDataGenerator

CONT_MIN = [0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
CONT_DIFF = [20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50]
MASK64 = (1 << 64) - 1


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class CriteoGenerator(MultiSlotDataGenerator):
    def __init__(self, hash_dim=1000001):
        super().__init__()
        self.hash_dim = hash_dim

    def generate_sample(self, line):
        def reader():
            fields = line.rstrip("\n").split("\t")
            dense = []
            for i in range(13):
                text = fields[1 + i]
                dense.append((float(text) - CONT_MIN[i]) / CONT_DIFF[i] if text else 0.0)
            out = [("dense_input", dense)]
            for k in range(1, 27):
                text = fields[13 + k]
                value = int(text, 16) if text else 1 << 32
                out.append((f"C{k}", [splitmix64((k << 33) | value) % self.hash_dim]))
            out.append(("label", [int(fields[0])]))
            yield out
        return reader


if __name__ == "__main__":
    CriteoGenerator(int(sys.argv[1]) if len(sys.argv) > 1 else 1000001).run_from_stdin()
