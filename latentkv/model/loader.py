"""Load a Hugging Face folder (config.json + safetensors) into its family's model, and back.

The shards are read by model/shards.py (safetensors only, never a pickle; DeepSeek's fp8 weights
dequantized, its multi-token-prediction layers skipped). Every tensor is checked by name and shape;
errors name the tensor and the file. The folder's `model_type` picks its family (model/families.py):
the config reader, the module class and the checkpoint's tensor names.

Loading streams: the model is built on the meta device, each parameter gets its storage when its
tensor arrives, and each quantized linear packs as soon as all its tensors came (its float weight
goes), so the peak is about the packed model plus the tensors in flight, not the model in its
dtype (DeepSeek-V2-Lite: ~11 GiB with w4a8 against 31 GB in bf16). The memory the model will take
(model/footprint.py) is checked against what is available before any tensor is read.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..config import ModelConfig
from ..cpu import native_bf16
from ..facts import ATTENTION_BACKEND_DEFAULT, MODEL_DTYPES
from ..sizes import available_memory, return_freed_memory
from .families import family, read_config
from .footprint import GIB, load_bytes, param_dtype
from .quant import QuantLinear
from ..rope import layer_inv_freq
from .route import Route, decide_route
from .shards import CheckpointError, file_tensors, weight_files

BAR_BYTES = 256 << 20  # checkpoints from this size load with a progress bar (small ones load in a blink)
TRIM_BYTES = 128 << 20  # read between two returns of freed heap memory (sizes.return_freed_memory)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype == "auto":
            # bf16 only where the CPU computes it natively (cpu.native_bf16); emulated it is ~100x slower
            dtype = ("bfloat16" if native_bf16() else "float32") if device.type == "cpu" else "float16"
        if dtype not in MODEL_DTYPES:
            raise ValueError(f"dtype {dtype!r} is not supported; expected one of {list(MODEL_DTYPES)} or 'auto'")
        dtype = MODEL_DTYPES[dtype]
    if dtype == torch.float16 and device.type == "cpu":
        raise ValueError(
            "dtype float16 is only supported on CUDA; on CPU use float32 or bfloat16 "
            "(float16 matmul is ~1000x slower there)"
        )
    return dtype


def load_model(
    path: str | Path,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attention_backend: str = ATTENTION_BACKEND_DEFAULT,
    quantization: str | None = None,
    route: Route | None = None,
) -> nn.Module:
    """Read config.json and the safetensors shards of `path` into a model on device/dtype, its
    linears quantized as `quantization` says (model/quant.py). `route` (model/route.py, e.g. the
    engine's) replaces dtype, device, attention_backend and quantization."""
    folder = Path(path)
    if not (folder / "config.json").exists():
        raise CheckpointError(f"{folder}: no config.json (is this a Hugging Face model folder?)")
    cfg = read_config(folder / "config.json")
    if route is None:
        device = torch.device(device)
        route = decide_route(device, resolve_dtype(dtype, device), attention_backend, quantization)
    files = weight_files(folder)
    model = meta_model(cfg, route)
    check_memory(folder, model, route)
    total = sum(f.stat().st_size for f in files)
    with tqdm(
        total=total,
        desc=f"loading {folder.name}",
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=total < BAR_BYTES,
    ) as bar:
        load_weights(model, file_tensors(files, cfg, bar), route.dtype)
        bar.update(total - bar.n)  # the shards' headers, and tensors skipped (multi-token prediction)
    model.pack_weights()
    return_freed_memory()
    return model.eval()


def model_from_tensors(
    cfg: ModelConfig,
    tensors: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> nn.Module:
    """A model from checkpoint-named tensors held in memory (the converter's), as load_model would build it."""
    model = meta_model(cfg, decide_route(device, dtype))
    load_weights(model, ((name, t, "memory") for name, t in tensors.items()), dtype, copy=False)
    model.pack_weights()
    return model.eval()


def check_memory(folder: Path, model: nn.Module, route: Route) -> None:
    """Refuse, before any tensor is read, a model that cannot fit in the memory available now."""
    need, available = load_bytes(model), available_memory(torch.device(route.device))
    if need > available:
        raise CheckpointError(
            f"{folder}: loading it as {str(route.dtype).removeprefix('torch.')} with {route.weights} weights needs "
            f"about {need / GIB:.1f} GiB but {available / GIB:.1f} GiB is available on {route.device}; "
            "free memory, or load it quantized (--quantization w4a8 or int4: about a third of bf16's bytes)"
        )


def meta_model(cfg: ModelConfig, route: Route) -> nn.Module:
    """Its family's model built as `route` says with every parameter on the meta device, for
    load_weights to give each its storage (on the route's device) when its tensor arrives; the rope
    tables are built now."""
    with torch.device("meta"):
        model = family(cfg.model_type).module(cfg, route)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.inv_freq = layer_inv_freq(cfg, i).to(route.device)
    return model


def empty_model(cfg: ModelConfig, route: Route, device: str | torch.device | None = None) -> nn.Module:
    """Its family's model built as `route` says, allocated on `device` (default: the route's; "meta" keeps it
    unallocated), not initialized: load_weights fills every parameter (packed ones in place), then
    `model.pack_weights()` puts them in the kernels' layouts."""
    device, dtype = torch.device(device or route.device), route.dtype
    with torch.device("meta"):
        model = family(cfg.model_type).module(cfg, route)
    model.to_empty(device=device)
    for module in model.modules():
        if getattr(module, "parts", None):  # packed: filled part by part; a part without a bias stays zero
            module.weight.data = torch.empty(module.weight.shape, dtype=dtype, device=device)
            if module.bias is not None:
                module.bias.data = torch.zeros(module.bias.shape, dtype=dtype, device=device)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.inv_freq = layer_inv_freq(cfg, i).to(device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def checkpoint_slots(model: nn.Module) -> dict[str, tuple[str, slice | None]]:
    """Checkpoint tensor name -> (parameter name, its rows; None: all of it). Packed linears
    (packed.py) hold several checkpoint tensors as row blocks (nano-vllm's packed_modules_mapping)."""
    slots: dict[str, tuple[str, slice | None]] = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        owner, _, kind = name.rpartition(".")
        module = model.get_submodule(owner)
        if not getattr(module, "parts", None):
            slots[name] = (name, None)
            continue
        parent, start = owner.rpartition(".")[0], 0
        for part, rows, bias in module.parts:
            if kind == "weight" or bias:
                slots[f"{parent}.{part}.{kind}"] = (name, slice(start, start + rows))
            start += rows
    return slots


def checkpoint_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under checkpoint names, packed linears cut back into their parts
    (views; what load_model read, bit for bit)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.config.tie_word_embeddings
    return {
        name: params[pname].detach() if rows is None else params[pname].detach()[rows]
        for name, (pname, rows) in checkpoint_slots(model).items()
        if not (tied and name == "lm_head.weight")
    }


def load_weights(model: nn.Module, tensors, dtype: torch.dtype, partial: bool = False, copy: bool = True) -> None:
    """Copy (checkpoint name, tensor, where) items into the model; every tensor the config
    implies must come (unless partial: the converter reloads one layer at a time). A parameter
    still on the meta device (meta_model) gets its storage when its tensor arrives, and a
    quantized linear packs (quant.QuantLinear.pack_weights) once all its tensors came. copy=False:
    a parameter may share a tensor of the model dtype (tensors held in memory); read from a file,
    it is copied, not a view of the file's mapping."""
    params = dict(model.named_parameters(remove_duplicate=False))
    slots = checkpoint_slots(model)
    tied = model.config.tie_word_embeddings
    expected = {n for n in slots if not (tied and n == "lm_head.weight")}
    owner, waiting = packing_waits(model, params, slots, expected)
    seen: dict[str, str] = {}
    where: set[str] = set()
    untrimmed = 0  # bytes read since freed memory was last given back
    for name, tensor, source in tensors:
        where.add(str(source))
        if tied and name == "lm_head.weight":
            continue  # some tied checkpoints still carry a copy
        if name in seen:  # a second copy could land in a linear already packed, unseen
            raise CheckpointError(f"tensor {name} is stored twice: in {seen[name]} and in {source}")
        module = owner.get(name)
        # a linear packed from this tensor alone reads it once, now: no copy (but a tied lm_head's
        # embedding stays the embedding)
        packs_now = module is not None and waiting[module] == {name} and slots[name][0] != "model.embed_tokens.weight"
        copy_param(params, slots, name, tensor, source, dtype, model, copy and not packs_now)
        seen[name] = str(source)
        if module is not None:
            waiting[module].discard(name)
            if not waiting[module]:  # its float weight goes: the loader keeps no reference to it
                params.pop(slots[name][0])
                module.pack_weights()
        untrimmed += tensor.nbytes
        if untrimmed >= TRIM_BYTES and owner:  # packing's freed temporaries would stay resident
            return_freed_memory()
            untrimmed = 0
    missing = sorted(expected - seen.keys())
    if missing and not partial:
        pname, rows = slots[missing[0]]
        shape = slot_shape(params[pname], rows)
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"missing tensor {missing[0]} (expected shape {shape}){more} in {', '.join(sorted(where))}"
        )


def packing_waits(model: nn.Module, params: dict, slots: dict, expected: set[str]):
    """-> (checkpoint name -> the quantized linear its tensor fills, that linear -> the names it
    still waits for: a packed projection's parts, or a tied lm_head's embedding), for the linears
    not packed yet."""
    linears = {id(m.weight): m for m in model.modules() if isinstance(m, QuantLinear) and not m.packed}
    owner = {name: linears[id(params[slots[name][0]])] for name in expected if id(params[slots[name][0]]) in linears}
    waiting: dict[QuantLinear, set[str]] = {}
    for name, module in owner.items():
        waiting.setdefault(module, set()).add(name)
    return owner, waiting


def slot_shape(param: torch.Tensor, rows: slice | None) -> tuple:
    return tuple(param.shape) if rows is None else (rows.stop - rows.start, *param.shape[1:])


def copy_param(
    params: dict,
    slots: dict,
    name: str,
    tensor: torch.Tensor,
    source,
    dtype: torch.dtype,
    model: nn.Module | None = None,
    copy: bool = True,
) -> None:
    """Copy one checkpoint tensor into its parameter (its rows of a packed one; copy=False: a whole
    parameter may be the tensor itself). A parameter on the meta device is given storage first, on
    `model`'s route device, under every name it has (tied)."""
    if name not in slots:
        raise CheckpointError(
            f"unexpected tensor {name} in {source} (shape {tuple(tensor.shape)}): not part of this model's config"
        )
    pname, rows = slots[name]
    param, shape = params[pname], slot_shape(params[pname], rows)
    if tuple(tensor.shape) != shape:
        raise CheckpointError(f"tensor {name} in {source} has shape {tuple(tensor.shape)}; the config expects {shape}")
    with torch.no_grad():
        if param.is_meta:
            device = torch.device(model.route.device)
            if rows is None:  # a copy: a view would keep the shard's mapping (and its pages) alive
                replace_param(model, params, pname, tensor.to(device=device, dtype=param_dtype(name, dtype), copy=copy))
                return
            # a packed parameter, filled part by part; a part without a bias stays zero
            param = replace_param(
                model,
                params,
                pname,
                (torch.zeros if pname.endswith(".bias") else torch.empty)(param.shape, dtype=dtype, device=device),
            )
        if rows is not None:
            param.data[rows] = tensor.to(device=param.device, dtype=param.dtype)
            return
        param.data = tensor.to(device=param.device, dtype=param_dtype(name, dtype), copy=copy)


def replace_param(model: nn.Module, params: dict, pname: str, value: torch.Tensor) -> nn.Parameter:
    """A meta parameter -> a parameter holding `value`; a tied lm_head takes the embedding's."""
    new = nn.Parameter(value, requires_grad=params[pname].requires_grad)
    names = [pname] + (
        ["lm_head.weight"] if pname == "model.embed_tokens.weight" and model.config.tie_word_embeddings else []
    )
    for name in names:
        owner, _, kind = name.rpartition(".")
        setattr(model.get_submodule(owner), kind, new)
        params[name] = new
    return new
