"""A CUDA GPU that computes on the CPU, so that the CPU test suite catches device bugs: inside :func:`fake_cuda`,
``torch.cuda.is_available()`` is True, the library puts its models and tensors on ``cuda:0``, and an op that meets a
tensor of that device and a CPU tensor raises the error CUDA raises::

    RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!

What a CUDA run calls on ``torch.cuda`` answers as one 80 GiB GPU with bfloat16 and a random generator of its own,
and ``torch.Generator("cuda")`` gives a generator of that device.

How: a ``cuda:0`` tensor is a :class:`FakeCudaTensor`, a wrapper subclass holding a CPU tensor. Every aten op goes
through :func:`run` (the subclass's ``__torch_dispatch__``, and :class:`FakeCudaMode`'s, which also sees the ops
that make a tensor from nothing, ``torch.zeros(..., device="cuda")``): it checks the devices of the op's tensors as
CUDA does, runs the op on the CPU tensors inside and wraps its results. Autograd works on the wrappers, above
dispatch, as it works on CUDA tensors. :class:`DeviceFunctionMode` does above dispatch what cannot be done there.

CUDA's rules, and nothing more lenient: a 0-dim CPU tensor goes with CUDA tensors as a Python number does; the
indices of ``x[i]`` and ``x[i] = v`` may be CPU tensors; ``copy_``, ``.to`` and an op given ``device=`` cross devices;
a random op's generator must be of the op's device.

What it cannot catch: ``torch.autocast("cuda")`` does not cast these tensors (torch's C++ code does not see them as
CUDA tensors), so dtype bugs that only autocast would expose stay hidden; dropout draws from the CPU's generator
(its op takes none); streams, asynchronous copies and memory are not modelled; several processes (NCCL, DDP, FSDP),
``torch.compile`` and vLLM are not run; and the few CUDA kernels that refuse even a 0-dim CPU tensor
(``index_select``'s index, say) are let through.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

DEVICE = torch.device("cuda", 0)
"""Where the fake tensors say they are."""

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
"""CUDA's error for an op that mixes cuda:0 and CPU tensors, word for word."""

# The device the wrapper's C++ TensorImpl carries. Not "cuda": on a CPU-only build autograd looks up a CUDA device
# guard and stream for every CUDA tensor and aborts the process (there is none to find). The lazy device has a
# guard, runs its backward on the CPU queue like the CPU does, and nothing else in a run uses it, so a device
# argument of "lazy" (autograd's own, from the TensorImpl) can only mean the fake GPU.
_IMPL_DEVICE = torch.device("lazy", 0)
_FAKE_TYPES = ("cuda", "lazy")

GIB = 1024**3
TOTAL_MEMORY = 80 * GIB
"""The fake GPU's memory: an H100's."""


def _is_fake_device(device: Any) -> bool:
    return device is not None and torch.device(device).type in _FAKE_TYPES


class FakeCudaTensor(torch.Tensor):
    """A ``cuda:0`` tensor whose data is ``_inner``, a CPU tensor of the same shape, strides and dtype."""

    _inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> FakeCudaTensor:
        if isinstance(inner, FakeCudaTensor) or inner.device.type != "cpu":
            raise TypeError(f"a FakeCudaTensor holds a CPU tensor, not a {type(inner).__name__} on {inner.device}")
        # An inference tensor exactly when its data is one: inside inference_mode, a view of a normal tensor is a
        # normal tensor, and autograd shares the base's version counter with it (refused for an inference tensor).
        if torch.is_inference_mode_enabled() and not inner.is_inference():
            with torch.inference_mode(False):
                return FakeCudaTensor(inner)
        fake = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.size(),
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=_IMPL_DEVICE,
            requires_grad=False,
        )
        fake._inner = inner
        return fake

    # What Python code asks of a tensor's device. torch's C++ code sees the lazy device (see _IMPL_DEVICE).
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return DEVICE

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    def get_device(self) -> int:
        return 0

    def untyped_storage(self) -> torch.UntypedStorage:
        # transformers and safetensors tell tied weights apart by their storage's address
        return self._inner.untyped_storage()

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"FakeCudaTensor({self._inner!r}, device='{DEVICE}')"

    def __reduce_ex__(self, protocol: int) -> Any:
        # Pickled as its CPU tensor: what torch.load(..., map_location="cpu") gives back from a CUDA tensor, and
        # the only way the library loads.
        return self._inner.__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> FakeCudaTensor:
        if id(self) in memo:
            return memo[id(self)]
        new = FakeCudaTensor(self._inner.clone())
        new.requires_grad_(self.requires_grad)
        memo[id(self)] = new
        for name, value in self.__dict__.items():  # _is_param of a parameter, hooks' bookkeeping
            if name != "_inner":
                setattr(new, name, copy.deepcopy(value, memo))
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        return new

    # nn.Module.to swaps a parameter for its moved copy through these (torch.utils.swap_tensors)
    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_inner"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: None, size: Any, stride: Any) -> FakeCudaTensor:
        return FakeCudaTensor(inner["_inner"])

    __torch_function__ = torch._C._disabled_torch_function_impl  # no Python overhead above dispatch

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return run(func, args, kwargs or {})


def to_fake(tensor: torch.Tensor) -> FakeCudaTensor:
    """``tensor`` (a CPU tensor) on the fake ``cuda:0``: a copy, as ``tensor.cuda()`` makes."""
    return FakeCudaTensor(tensor.detach().clone())


# --------------------------------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------------------------------

aten = torch.ops.aten

# Ops whose very purpose is to move data between devices.
_CROSS_DEVICE = {aten.copy_, aten._copy_from, aten._copy_from_and_resize, aten._to_copy, aten.lift_fresh}

# Indexing moves CPU indices to the tensor's device (x[i], x[i] = v): their argument "indices" may be on the CPU.
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_, aten._unsafe_index,
             aten._unsafe_index_put}  # fmt: skip


def _arguments(func: Any, args: tuple, kwargs: dict) -> Iterator[tuple[str, Any]]:
    """(name, value) of each argument the op was called with."""
    for schema_arg, value in zip(func._schema.arguments, args, strict=False):
        yield schema_arg.name, value
    yield from kwargs.items()


def check_devices(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise CUDA's :data:`MIXED` when ``func`` would get fake-CUDA tensors beside CPU tensors that CUDA refuses:
    any CPU tensor with a dimension (a 0-dim one is a scalar), except indices of indexing ops."""
    exempt = "indices" if func.overloadpacket in _INDEXING else None
    for name, value in _arguments(func, args, kwargs):
        if name == exempt:
            continue
        for leaf in pytree.tree_leaves(value):
            cpu = isinstance(leaf, torch.Tensor) and not isinstance(leaf, FakeCudaTensor) and leaf.device.type == "cpu"
            if cpu and leaf.dim() > 0:
                raise RuntimeError(MIXED)


def run(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func`` as CUDA would run it: on the CPU tensors inside the fake ones, its results on the fake device when
    it ran there (an input was on it, or a ``device`` argument says so) and CUDA's error when devices mix."""
    if func.overloadpacket is aten.to:
        return _to(func, args, kwargs)
    has_fake = any(isinstance(leaf, FakeCudaTensor) for leaf in pytree.arg_tree_leaves(*args, **kwargs))
    # An op given `device` (a factory, *_like, new_*, _to_copy) puts its result there wherever its tensors are (CUDA
    # takes zeros_like(cpu_tensor, device="cuda")); any other runs where its tensors are, and they must agree.
    target = kwargs.get("device")
    on_fake = _is_fake_device(target) if target is not None else has_fake
    if not on_fake and not has_fake:
        return func(*args, **kwargs)  # an op of the CPU
    if target is None and func.overloadpacket not in _CROSS_DEVICE:
        check_devices(func, args, kwargs)
    if on_fake:
        if target is not None:
            kwargs = {**kwargs, "device": torch.device("cpu")}
        if kwargs.get("generator") is None:  # CUDA's random ops draw from CUDA's generator
            func, kwargs = _drawing_from_cuda_generator(func, kwargs)
        if _active:
            _active[-1].ops += 1
    inner_args, inner_kwargs = pytree.tree_map_only(FakeCudaTensor, lambda t: t._inner, (args, kwargs))
    out = func(*inner_args, **inner_kwargs)
    return _results(func, args, kwargs, out, on_fake)


def _drawing_from_cuda_generator(func: Any, kwargs: dict) -> tuple[Any, dict]:
    """``func`` and ``kwargs`` drawing from the fake GPU's default generator when ``func`` is a random op: given it
    as ``generator``, in the overload that takes one (``rand.default`` → ``rand.generator``)."""
    if func not in _RANDOM:
        overload = func
        if not any(a.name == "generator" for a in func._schema.arguments):
            name = "generator" if func._overloadname == "default" else f"{func._overloadname}_generator"
            overload = getattr(func.overloadpacket, name, None)
        _RANDOM[func] = overload
    overload = _RANDOM[func]
    if overload is None:
        return func, kwargs
    return overload, {**kwargs, "generator": _CUDA_DEFAULT_GENERATOR}


_RANDOM: dict[Any, Any] = {}
"""Each op seen on the fake GPU → its overload that takes a generator (None: the op draws nothing)."""


def _to(func: Any, args: tuple, kwargs: dict) -> Any:
    """``aten.to`` (its device is positional, and it returns its input when nothing changes) as CUDA runs it."""
    given = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | kwargs
    tensor, other = given["self"], given.get("other")
    device = other.device if other is not None else given.get("device")
    dtype = other.dtype if other is not None else given.get("dtype")
    memory_format = given.get("memory_format")
    stays = device is None or _is_fake_device(device) == isinstance(tensor, FakeCudaTensor)
    unchanged = dtype in (None, tensor.dtype) and memory_format in (None, torch.preserve_format)
    if stays and unchanged and not given.get("copy"):
        return tensor
    copied = {"dtype": dtype, "device": device, "non_blocking": given.get("non_blocking", False)}
    if memory_format is not None:
        copied["memory_format"] = memory_format
    return run(aten._to_copy.default, (tensor,), {k: v for k, v in copied.items() if v is not None})


def _results(func: Any, args: tuple, kwargs: dict, out: Any, on_fake: bool) -> Any:
    """``out`` with its tensors wrapped when the op ran on the fake device; a result that is a mutated argument (an
    in-place op's ``self``, an ``out=``) is that argument itself, on whichever device it was."""
    returns = func._schema.returns
    written = [r.alias_info is not None and r.alias_info.is_write for r in returns]
    if not any(written):
        return pytree.tree_map_only(torch.Tensor, FakeCudaTensor, out) if on_fake else out
    values = dict(_arguments(func, args, kwargs))
    by_alias = {
        frozenset(a.alias_info.before_set): values.get(a.name)
        for a in func._schema.arguments
        if a.alias_info is not None and a.alias_info.is_write
    }
    results = []
    outs = out if len(returns) > 1 else (out,)
    for r, is_written, value in zip(returns, written, outs, strict=True):
        if is_written:
            original = by_alias[frozenset(r.alias_info.before_set)]
            if isinstance(original, FakeCudaTensor) and original.shape != original._inner.shape:
                raise NotImplementedError(f"fake_cuda: {func} changed a tensor's shape in place; not modelled")
            results.append(original)
        else:
            results.append(pytree.tree_map_only(torch.Tensor, FakeCudaTensor, value) if on_fake else value)
    return tuple(results) if len(returns) > 1 else results[0]


class FakeCudaMode(TorchDispatchMode):
    """Runs every op through :func:`run`: factory ops asked for ``device="cuda"`` too, which no tensor brings."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return run(func, args, kwargs or {})


# --------------------------------------------------------------------------------------------------------------
# Above autograd: generators, .to(), .data =
# --------------------------------------------------------------------------------------------------------------


class _CudaGenerator(torch._C.Generator):
    """A generator of the fake ``cuda:0``: a CPU generator inside, that says it is a CUDA one."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return DEVICE


_CUDA_DEFAULT_GENERATOR = _CudaGenerator()
"""``torch.cuda.default_generators[0]``: what CUDA's random ops draw from when given no generator."""


class _GeneratorType(type(torch._C.Generator)):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)


class Generator(torch._C.Generator, metaclass=_GeneratorType):
    """``torch.Generator`` inside :func:`fake_cuda`: a CUDA device gives a generator of the fake GPU."""

    def __new__(cls, device: Any = "cpu") -> torch._C.Generator:  # type: ignore[misc]
        if _is_fake_device(device):
            _check_index(torch.device(device))
            return _CudaGenerator()
        return torch._C.Generator(device)


def _check_generator(func: Any, args: tuple, kwargs: dict, generator: torch._C.Generator) -> None:
    """CUDA's check that a random op's generator is of the op's device (the ``device`` argument, else the tensor's)."""
    device = kwargs.get("device")
    if device is None:
        device = next((a.device for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)), "cpu")
    op, gen = torch.device(device).type, generator.device.type
    if op != gen:
        raise RuntimeError(f"Expected a '{op}' device type for generator but found '{gen}'")


def _from_data(func: Any, args: tuple, kwargs: dict, from_fake: bool) -> torch.Tensor:
    """``torch.tensor(data, device=...)`` (and its kin) or ``fake.new_tensor(data, ...)``: made on the CPU, then
    moved where ``device`` (by default, the fake tensor's) says."""
    kwargs = dict(kwargs)
    device = kwargs.pop("device", DEVICE if from_fake else None)
    requires_grad = kwargs.pop("requires_grad", False)
    if from_fake:
        args = (args[0]._inner, *args[1:])
    out = func(*args, **kwargs)
    if _is_fake_device(device):
        out = out.to(DEVICE)
    elif device is not None:
        out = out.to(device)
    return out.requires_grad_(requires_grad) if requires_grad else out


def _with_index(device: Any) -> Any:
    """``device`` with its index when it is the fake GPU (``"cuda"`` → ``cuda:0``, ``0`` → ``cuda:0``), else itself."""
    if isinstance(device, bool) or device is None:
        return device
    if isinstance(device, int) or _is_fake_device(device):
        _check_index(device)
        return DEVICE
    return device


def _stays(args: tuple, kwargs: dict) -> bool:
    """Whether ``fake.to(*args, **kwargs)`` leaves it where it is as it is, so that it returns ``fake`` itself."""
    if kwargs.get("copy") or any(isinstance(a, bool) for a in args):  # to(..., non_blocking, copy) positionally
        return False
    device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if device is not None and not _is_fake_device(device):
        return False
    return memory_format in (None, torch.preserve_format) and dtype is None


class DeviceFunctionMode(TorchFunctionMode):
    """What must be done above dispatch: check the generator a random op was handed (dispatch gets a new Python
    object for it, which no longer says which device it is of); make ``torch.tensor(data, device="cuda")`` and
    ``.cuda()`` / ``.to("cuda")``, which ask a CUDA build for its current device before they dispatch anything;
    return a tensor already on the device from ``.to`` itself, as CUDA does; ``.tolist()`` and ``.numpy()`` as on
    CUDA; and ``fake.data = other``, which must swap the CPU tensor inside too (``nn.Module.to(dtype)`` does it)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _FROM_DATA or func is torch.Tensor.new_tensor:
            # torch.tensor(data, device="cuda") and gpu_tensor.new_tensor(data) set the device as the current one
            # before they dispatch anything, which a CPU-only build cannot: made on the CPU and moved, as CUDA does
            source = args[0] if func is torch.Tensor.new_tensor else None
            on_fake = isinstance(source, FakeCudaTensor)
            if on_fake or _is_fake_device(kwargs.get("device")):
                return _from_data(func, args, kwargs, on_fake)
        if kwargs.get("generator") is not None:
            _check_generator(func, args, kwargs, kwargs["generator"])
        if func is torch.Tensor.cuda:  # made a .to(): cuda() asks a CUDA build for the current device
            given = dict(zip(("self", "device", "non_blocking", "memory_format"), args, strict=False)) | kwargs
            tensor, device = given.pop("self"), given.pop("device", None)
            return tensor.to(_with_index("cuda" if device is None else device), **given)
        if func is torch.Tensor.to:  # "cuda" without an index also asks a CUDA build for the current device
            args = tuple(_with_index(a) if isinstance(a, (str, torch.device, int)) else a for a in args)
            kwargs = {k: _with_index(v) if k == "device" else v for k, v in kwargs.items()}
            if isinstance(args[0], FakeCudaTensor) and _stays(args[1:], kwargs):
                return args[0]
        if args and isinstance(args[0], FakeCudaTensor):
            if func is torch.Tensor.tolist:  # refused for subclasses; CUDA copies to the host
                return args[0]._inner.tolist()
            if func is torch.Tensor.numpy:
                raise TypeError(
                    f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to "
                    "host memory first."
                )
            if func == _SET_DATA and isinstance(args[1], FakeCudaTensor):
                func(*args)  # the shape and dtype of the wrapper
                args[0]._inner = args[1]._inner
                return None
        return func(*args, **kwargs)


_SET_DATA = torch.Tensor.data.__set__
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}


# --------------------------------------------------------------------------------------------------------------
# torch.cuda
# --------------------------------------------------------------------------------------------------------------


def _check_index(device: torch.device | int | str | None) -> int:
    index = device if isinstance(device, int) else (torch.device(device).index if device is not None else None)
    if index not in (None, 0):
        raise RuntimeError("CUDA error: invalid device ordinal")
    return 0


def _cuda_functions() -> dict[str, Any]:
    """The ``torch.cuda`` functions a CUDA run calls, answering as one 80 GiB GPU that holds nothing yet."""
    gen = _CUDA_DEFAULT_GENERATOR
    properties = types.SimpleNamespace(
        name="fake CUDA (computes on the CPU)", total_memory=TOTAL_MEMORY, major=9, minor=0, multi_processor_count=132
    )

    def no_memory(device: Any = None) -> int:
        _check_index(device)
        return 0

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    def synchronize(device: Any = None) -> None:
        _check_index(device)

    def manual_seed(seed: int) -> None:
        gen.manual_seed(int(seed))

    def seed() -> None:
        gen.seed()

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        _check_index(device)
        return gen.get_state()

    def set_rng_state(state: torch.Tensor, device: Any = "cuda") -> None:
        _check_index(device)
        gen.set_state(state)

    def set_rng_state_all(states: list[torch.Tensor]) -> None:
        (state,) = states  # one GPU
        gen.set_state(state)

    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "_lazy_init": nothing,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": _check_index,
        "_exchange_device": _check_index,
        "_maybe_exchange_device": _check_index,
        "get_device_name": lambda device=None: properties.name,
        "get_device_properties": lambda device=None: properties,
        "get_device_capability": lambda device=None: (properties.major, properties.minor),
        "is_bf16_supported": lambda including_emulation=True: True,
        "synchronize": synchronize,
        "is_current_stream_capturing": lambda: False,  # no CUDA graph is captured (torch 2.10's optimizers ask)
        "empty_cache": nothing,
        "mem_get_info": lambda device=None: (TOTAL_MEMORY, TOTAL_MEMORY),
        "memory_allocated": no_memory,
        "max_memory_allocated": no_memory,
        "memory_reserved": no_memory,
        "max_memory_reserved": no_memory,
        "reset_peak_memory_stats": nothing,
        "reset_max_memory_allocated": nothing,
        "memory_stats": lambda device=None: {},
        "default_generators": (gen,),
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed,
        "seed": seed,
        "seed_all": seed,
        "initial_seed": gen.initial_seed,
        "get_rng_state": get_rng_state,
        "get_rng_state_all": lambda: [gen.get_state()],
        "set_rng_state": set_rng_state,
        "set_rng_state_all": set_rng_state_all,
    }


@dataclasses.dataclass
class FakeGPU:
    """What :func:`fake_cuda` yields: the device, and how many aten ops were computed on it so far (a test's proof
    that the run it checked did run there)."""

    device: torch.device = DEVICE
    ops: int = 0


_NOT_CAPTURING = types.SimpleNamespace(is_capturing=lambda: False)
"""The fake GPU's one stream, as a CUDA build of torch asks for it (a CPU build never does): no graph is captured."""

_active: list[FakeGPU] = []
_ABSENT = object()


@contextlib.contextmanager
def fake_cuda(seed: int = 0) -> Iterator[FakeGPU]:
    """Inside: one fake CUDA GPU (``cuda:0``) that computes on the CPU and raises CUDA's device errors.
    ``seed`` seeds its generator (``torch.manual_seed`` does too, as on CUDA). Not reentrant."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name, _ABSENT)))  # a private one another torch may not have
        setattr(owner, name, value)

    _CUDA_DEFAULT_GENERATOR.manual_seed(seed)
    gpu = FakeGPU()
    _active.append(gpu)
    try:
        for name, value in _cuda_functions().items():
            patch(torch.cuda, name, value)
        patch(torch, "Generator", Generator)
        if hasattr(torch, "accelerator"):  # torch ≥ 2.12's optimizers ask it whether the stream is capturing a graph
            patch(torch.accelerator, "current_stream", lambda device=None: _NOT_CAPTURING)
        with FakeCudaMode(), DeviceFunctionMode():
            yield gpu
    finally:
        for owner, name, value in reversed(saved):
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        _active.remove(gpu)
