#!/usr/bin/env python3
"""Host time of IBM fms-fsdp's data loader per training step, on the CPU alone.

    fms_loader_probe.py --dataset-utils PATH [--work DIR] [--steps N]

fms-fsdp's main_training.py builds its loader with num_workers=0 (fms_fsdp/utils/
dataloader_utils.py at 4ffb9bd and ed74fd5), so the loader runs in the training process, and
its train loop calls .item() on the gradient norm and the loss every step
(fms_fsdp/utils/train_utils.py), which drains the GPU: whatever the loader takes between
steps leaves the GPU idle. This probe times that work. PATH is fms_fsdp/utils/
dataset_utils.py from an fms-fsdp checkout (git show 4ffb9bd:fms_fsdp/utils/dataset_utils.py);
the probe writes a synthetic corpus in the layout that file reads (docs/dataloader.md: one
arrow file a dataset, one record batch a document with an int32 'tokens' column, and
meta/counts.csv), builds get_data_loader's chain (Sampling_Dataset over
Scalable_Shard_Dataset, Buffer_Dataset to seq 4096 + 1, Preload_Buffer_Dataset of 10,000
lines, the causal_lm split) for rank 0 of 128 with 768 logical shards and the 14 datasets and
weights of fms_fsdp/config/training.py at 4ffb9bd, and times batches of 2 lines through the
shuffle buffer's fill (two lines read a line out, the first 10,000 lines) and after it.

torch is not needed: the file's host calls into torch (a seeded generator, randint().item(),
IntTensor of a Python list, IterableDataset) are stood in by the standard library, each
doing the same per-element Python work. Reads come from the page cache, so the figure is
the loader's CPU work, not a network file system's latency.
"""
import argparse
import array
import importlib.util
import os
import random
import sys
import time
import types

NAMES = ("commoncrawl webhose github_clean wikipedia_de wikipedia_es wikipedia_fr wikipedia_ja "
         "wikipedia_pt wikimedia uspto pubmedcentral arxiv stackexchange PG19").split()
WEIGHTS = [7700, 500, 550, 28, 17, 22, 25, 8, 100, 500, 175, 250, 100, 25]


def install_torch_stand_in():
    class Generator:
        def __init__(self):
            self.r = random.Random()

        def manual_seed(self, s):
            self.r.seed(s)
            return self

    class Item:
        def __init__(self, v):
            self.v = v

        def item(self):
            return self.v

    torch = types.ModuleType("torch")
    torch.Generator = Generator
    torch.randint = lambda n, shape, generator: Item(generator.r.randrange(n))
    torch.IntTensor = lambda lst: array.array("i", lst)  # one conversion per Python int
    data = types.ModuleType("torch.utils.data")
    data.IterableDataset = object
    torch.utils = types.ModuleType("torch.utils")
    torch.utils.data = data
    sys.modules.update({"torch": torch, "torch.utils": torch.utils, "torch.utils.data": data})


def write_corpus(root, docs=1536):
    try:
        import pyarrow as pa  # the corpus format fms-fsdp's loader reads; not a test dependency
    except ImportError:
        sys.exit("fms_loader_probe.py: needs pyarrow (pip install pyarrow) to write the arrow corpus")
    os.makedirs(os.path.join(root, "meta"), exist_ok=True)
    schema, rng, rows = pa.schema([("tokens", pa.int32())]), random.Random(0), []
    for d in NAMES:
        os.makedirs(os.path.join(root, d), exist_ok=True)
        with pa.ipc.new_file(os.path.join(root, d, "shard_0.arrow"), schema) as w:
            for _ in range(docs):  # 50 to 2,000 tokens a document
                toks = [rng.randrange(32000) for _ in range(rng.randint(50, 2000))]
                w.write_batch(pa.record_batch([pa.array(toks, pa.int32())], schema=schema))
        rows.append(f"/{d}/shard_0.arrow,{docs}")
    with open(os.path.join(root, "meta", "counts.csv"), "w") as f:
        f.write("dataset/filename,documents\n" + "\n".join(rows) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset-utils", required=True)
    ap.add_argument("--work", default="/tmp/fms_loader_probe")
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    install_torch_stand_in()
    spec = importlib.util.spec_from_file_location("fms_dataset_utils", a.dataset_utils)
    du = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(du)
    root = os.path.join(a.work, "data")
    if not os.path.exists(os.path.join(root, "meta", "counts.csv")):
        write_corpus(root)

    def causal_lm(line):  # get_data_loader's: input and target shifted by one, 1 prompt token
        seq = sys.modules["torch"].IntTensor(line)
        t = seq[1:]
        t[0] = -100
        return seq[:-1], t

    d = du.Sampling_Dataset(root, du.Scalable_Shard_Dataset, 0, 128, 1, trainsplit=1, is_val=False,
                            min_length=3, datasets=NAMES, weights=WEIGHTS, seed=2023, verbose=False,
                            n_logical_shards=768)
    d = du.Preprocess_Dataset(du.Preload_Buffer_Dataset(
        du.Buffer_Dataset(d, 4096 + 1, drop_final_token=1, pack_hard=True), 10000), causal_lm)
    it = iter(d)
    for phase, steps in (("buffer fill", 5000), ("after the fill", a.steps)):
        t = time.perf_counter()
        for _ in range(steps * 2):  # batch_size 2: two lines a step
            next(it)
        print(f"{phase}: {(time.perf_counter() - t) / steps * 1e3:.2f} ms a step of 2 lines")


if __name__ == "__main__":
    main()
