import sys
from pathlib import Path
import torch
from latentkv.bench import frontier
torch.set_num_threads(1)
if __name__ == "__main__":
    which = sys.argv[1]
    systems = tuple(sys.argv[2:]) or (which,)
    frontier.FULL.update(examples=24, ppl_tokens=1024)  # a cut of the full preset: the shared machine's time
    frontier.run_frontier(None, Path(f"/work/runs-tc/{which}"), budgets=None, systems=systems, dtypes=("float32",),
                          formats=("transform_code",), rope_dims=("all",))
