"""`verl.protocol.all_gather_data_proto` on 2 gloo ranks: this file is also the rank script (run as __main__)."""

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "workers"))

from worker_setup import close_process_group, run_ranks  # noqa: E402


def rank_rows(rank: int):
    """Rank 0 holds 2 rows, rank 1 holds 3: values that name their rank and row."""
    from verl.protocol import DataProto

    n = 2 + rank
    ids = torch.arange(n) + 10 * rank
    return DataProto.from_dict(
        tensors={"ids": ids, "pair": torch.stack([ids, -ids], dim=1).float(), "mask": ids % 2 == 0},
        non_tensors={"tag": np.array([f"r{rank}-{i}" for i in range(n)], dtype=object)},
        meta_info={"rank": rank},
    )


def main(out_path: str) -> None:
    import torch.distributed as dist

    from verl.protocol import all_gather_data_proto

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = dist.new_group([0, 1])  # a group of its own, as the Ulysses SP group is
    data = rank_rows(rank)
    same = id(data)
    returned = all_gather_data_proto(data, process_group=group)
    torch.save({"returned": returned, "same_object": id(data) == same, "len": len(data),
                "tensors": {k: v for k, v in data.batch.items()}, "batch_size": tuple(data.batch.batch_size),
                "tag": list(data.non_tensor_batch["tag"]), "meta": data.meta_info}, out_path)
    close_process_group()


def test_two_ranks_gather_every_row_in_rank_order(tmp_path):
    paths = [tmp_path / f"rank{r}.pt" for r in range(2)]
    run_ranks(lambda rank: [os.path.abspath(__file__), str(paths[rank])], 2, timeout=50)
    ids = torch.tensor([0, 1, 10, 11, 12])
    for rank, path in enumerate(paths):
        got = torch.load(path)
        # in place, like torch.distributed.all_gather: nothing returned, the caller's object holds all 5 rows
        assert got["returned"] is None and got["same_object"] and got["len"] == 5 and got["batch_size"] == (5,)
        assert torch.equal(got["tensors"]["ids"], ids)
        assert torch.equal(got["tensors"]["pair"], torch.stack([ids, -ids], dim=1).float())
        assert got["tensors"]["mask"].dtype == torch.bool and got["tensors"]["mask"].tolist() == [1, 0, 1, 0, 1]
        assert got["tag"] == ["r0-0", "r0-1", "r1-0", "r1-1", "r1-2"]
        assert got["meta"] == {"rank": rank}  # meta_info is not gathered


if __name__ == "__main__":
    main(sys.argv[1])
