#!/usr/bin/python3
"""torchrun for tests: Debian's python3-torch 1.13 torchrun, made to start under Python 3.11.

Usage (exactly torchrun's arguments):

    /usr/bin/python3 tests/torchrun.py --nproc_per_node 2 --no_python ./prog [args...]

Why: torchrun's defaults `--redirects 0 --tee 0` go through Std.from_str, which looks the number
up by iterating over the IntFlag `Std`. Since Python 3.11, iterating a flag class yields only its
single-bit members, so NONE (0) and ALL (3) are never found and from_str returns None; the agent
then dies in to_map with "'NoneType' object has no attribute 'get'". This wrapper replaces that
one lookup with a direct conversion, Std(int(value)), and otherwise runs torch.distributed.run
unchanged (same argument parsing, rendezvous, restarts and exit status).

Needs the interpreter that has torch (/usr/bin/python3 on Debian), not whichever python is first
on PATH.
"""

import re
import sys

from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing import api as multiprocessing_api

Std = multiprocessing_api.Std


def std_from_str(cls, value):
    """Std.from_str with the same accepted syntax ("0".."3" or "0:3,1:0"), minus the broken lookup."""
    if re.match(multiprocessing_api._VALUE_REGEX, value):
        return cls(int(value))
    if re.match(multiprocessing_api._MAPPING_REGEX, value):
        mapping = {}
        for item in value.split(","):
            local_rank, std = item.split(":")
            mapping[int(local_rank)] = cls(int(std))
        return mapping
    raise ValueError(
        f"{value} does not match: <{multiprocessing_api._VALUE_REGEX}>"
        f" or <{multiprocessing_api._MAPPING_REGEX}>"
    )


# run.py calls Std.from_str on the class it imported, which is this same class object.
Std.from_str = classmethod(std_from_str)

if __name__ == "__main__":
    sys.exit(torch_run.main(sys.argv[1:]))
