"""convert --kv-bytes 5760, transform-coded candidates at rope "all" only (as bench frontier converts)."""
import torch
from latentkv.convert.api import convert
from latentkv.convert.options import ConvertOptions
from latentkv.sources.readers import read_source

torch.set_num_threads(1)
convert(read_source(None), "conv5760",
        ConvertOptions(kv_bytes=5760, eval_tokens=0, kv_formats=("transform_code",), kv_rope_dims=("all",)))
