"""Run the script as one rank of its job, alone: ``with RankHooks(tracker, config).installed():`` in the capture child.

What a rank of a real job finds, answered without another process:

* ``torch.distributed.init_process_group`` (any backend the script names: ``nccl``, ``gloo``,
  ``cuda:nccl,cpu:gloo``, none; any ``init_method``) makes the default group of
  ``process_group.AnsweringGroup`` with the rank and world size the script or the launcher's
  environment gives (``RANK``, ``WORLD_SIZE``); the store is in memory, nothing connects.
  ``get_backend`` answers the backend the script asked for (``nccl`` when it named none, as a CUDA
  run with NCCL picks), ``is_nccl_available`` True.
* ``new_group`` / ``split_group`` (device meshes make their groups through them) make answering
  groups too, whatever backend or options they name; every group's ranks are a fact (``facts``).
* DDP's check that every rank holds the same parameters (``_verify_params_across_processes``)
  passes: one rank alone holds them by construction.
* ``all_gather_object``, ``gather_object``, ``broadcast_object_list``, ``scatter_object_list``:
  every rank is taken to send what this rank sends (a pickled copy of it), so the answer is the
  one a job of equal ranks gives; ``recv_object_list`` leaves the list as it is.
* ``torch.multiprocessing.spawn`` / ``start_processes`` and ``multiprocessing.Process.start`` of a
  script's own function (not a DataLoader worker) start no process: the rank this capture stands
  for (``config["spawn_index"]``, 0 by default) runs in this process when it is started, the
  others are reported as finished.
* a pipeline stage (``torch.distributed.pipelining``'s stages) and every DTensor whose shards are
  uneven are facts for the roles rule (``allocsim.torch_capture.distributed.roles``).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process as mp_process
import os
import sys
from typing import Any, Iterator
from urllib.parse import parse_qs, urlparse

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .communicators import CommunicatorLog, functional_collective
from .facts import Facts
from .process_group import BACKEND, AnsweringGroup, copy_object, register_backend

#: DTensor layouts checked for uneven shards (past this, new layouts are not checked).
MAX_LAYOUTS_CHECKED = 1 << 16


def _from_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _rank_and_size(init_method: Any, rank: int, world_size: int) -> tuple[int, int]:
    """The rank and world size ``init_process_group`` would settle on: its arguments, the URL's query, the environment."""
    if isinstance(init_method, str) and "?" in init_method:
        query = parse_qs(urlparse(init_method).query)
        if rank < 0 and "rank" in query:
            rank = int(query["rank"][0])
        if world_size < 0 and "world_size" in query:
            world_size = int(query["world_size"][0])
    if rank < 0:
        rank = _from_env("RANK", 0)
    if world_size < 0:
        world_size = _from_env("WORLD_SIZE", 1)
    return rank, world_size


def _asked_backend(backend: Any) -> str:
    if backend is None or str(backend) == "undefined":
        return "nccl"            # what a CUDA build with NCCL picks for cuda tensors
    return str(backend).lower()


class _DonePopen:
    """What ``multiprocessing.Process`` holds for a process that has ended (it never started one)."""

    def __init__(self, exitcode: int):
        self.returncode = exitcode
        self.pid = os.getpid()
        self.sentinel = None

    def poll(self, flag: int = 0) -> int:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode

    def terminate(self) -> None:
        return None

    kill = terminate

    def close(self) -> None:
        return None


class _SpawnContext:
    """``torch.multiprocessing.spawn(..., join=False)``'s context for ranks that already ran here."""

    def __init__(self, nprocs: int):
        self.processes: list[Any] = []
        self.nprocs = nprocs

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        return True

    def pids(self) -> list[int]:
        return [os.getpid()]


class RankHooks:
    """The patches that make this process one rank of the job (see the module doc)."""

    def __init__(self, tracker: Any, config: dict[str, Any] | None = None):
        config = dict(config or {})
        self.tracker = tracker
        self.facts = Facts(tracker.channel.send)
        self.communicators = CommunicatorLog()
        self._collective_of_op: dict[Any, str | None] = {}
        self.spawn_index = int(config.get("spawn_index") or 0)
        self.messages = [m for m in config.get("messages") or [] if isinstance(m, dict)]
        self.broadcasts_given = [m for m in config.get("broadcasts") or [] if isinstance(m, dict)]
        self.relay = bool(config.get("relay"))     # other stages' shapes come from allocsim's process as sent
        self.asked_backend = "nccl"
        self.in_rank = False           # a started rank's function is running here: its own starts are real
        self.processes_started = 0
        self.launching: bool | None = None   # whether the script's processes are its ranks (decided at the first)
        self._layouts: dict[tuple, bool] = {}

    # ------------------------------------------------------------------ process groups
    def _init_process_group(self, original: Any) -> Any:
        hooks = self

        def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                               world_size: int = -1, rank: int = -1, store: Any = None, group_name: str = "",
                               pg_options: Any = None, device_id: Any = None, **kwargs: Any) -> None:
            rank, world_size = _rank_and_size(init_method, int(rank), int(world_size))
            hooks.asked_backend = _asked_backend(backend)
            extra = {k: v for k, v in kwargs.items() if k == "_ranks"}
            original(backend=BACKEND, store=dist.HashStore(), rank=rank, world_size=world_size,
                     group_name=group_name, **({"timeout": timeout} if timeout is not None else {}), **extra)
            hooks.facts.world(rank, world_size, hooks.asked_backend)
            hooks.communicators.rank = rank
            if device_id is not None:
                # eager init: PyTorch makes the default group's communicator now (ProcessGroupNCCL's
                # eagerConnectSingleDevice), used or not
                hooks.communicators.eager(dist.group.WORLD)
        return init_process_group

    def _new_group(self, original: Any) -> Any:
        hooks = self

        def new_group(ranks: Any = None, timeout: Any = None, backend: Any = None, pg_options: Any = None,
                      use_local_synchronization: bool = False, group_desc: Any = None, device_id: Any = None,
                      **kwargs: Any) -> Any:
            group = original(ranks=ranks, timeout=timeout, backend=None, pg_options=None,
                             use_local_synchronization=use_local_synchronization, group_desc=group_desc, **kwargs)
            members = sorted(int(r) for r in ranks) if ranks else list(range(dist.get_world_size()))
            hooks.facts.group(members, group_desc or "")
            return group
        return new_group

    def _split_group(self) -> Any:
        hooks = self

        def split_group(parent_pg: Any = None, split_ranks: Any = None, timeout: Any = None, pg_options: Any = None,
                        group_desc: Any = None, backend: Any = None) -> Any:
            mine = None
            for ranks in split_ranks or []:
                group = hooks._patched_new_group(ranks=list(ranks), timeout=timeout, group_desc=group_desc)
                if dist.get_rank() in ranks:
                    mine = group
            return mine
        return split_group

    def _get_backend(self, original: Any) -> Any:
        hooks = self

        def get_backend(group: Any = None) -> Any:
            name = original(group)
            return hooks.asked_backend if str(name) == BACKEND else name
        return get_backend

    def _batch_isend_irecv(self, original: Any) -> Any:
        """Point-to-point sent together: on the group's communicator (``communicators`` module doc)."""
        batching = self.communicators.batching

        def batch_isend_irecv(p2p_op_list: Any) -> Any:
            batching.depth = getattr(batching, "depth", 0) + 1
            try:
                return original(p2p_op_list)
            finally:
                batching.depth -= 1
        return batch_isend_irecv

    def _note_operator(self, func: Any, args: tuple, kwargs: dict) -> None:
        """A functional collective (``torch.ops._c10d_functional.*``: DTensor's redistributions) ran on its group."""
        collective = self._collective_of_op.get(func, False)
        if collective is False:
            name = func.name() if hasattr(func, "name") else ""
            collective = self._collective_of_op[func] = (functional_collective(name)
                                                         if name.startswith("_c10d_functional::") else None)
        if collective is None:
            return
        group_name = kwargs.get("group_name")
        if not isinstance(group_name, str):
            group_name = next((a for a in reversed(args) if isinstance(a, str)), None)
        if group_name is None:
            return
        try:
            group = c10d._resolve_process_group(group_name)
        except (RuntimeError, ValueError, KeyError, AttributeError):
            return
        self.communicators.note(group, collective)

    def _broadcast_log(self) -> Any:
        """Rank 0's small broadcasts recorded here, or replayed for this rank (``broadcasts`` module doc)."""
        from ..devicemap import _THREAD_MODE  # noqa: PLC0415
        from .broadcasts import BroadcastLog  # noqa: PLC0415

        def values_of(t: Any) -> Any:
            mode = getattr(_THREAD_MODE, "mode", None)
            return mode.values.get(t) if mode is not None else None

        def set_values(t: Any, value: Any) -> None:
            mode = getattr(_THREAD_MODE, "mode", None)
            if mode is not None:
                mode.values.set(t, value)
        return BroadcastLog(self.facts.send, self.broadcasts_given, values_of, set_values)

    def _send_communicators(self) -> None:
        """The ``communicators`` fact: every NCCL communicator this rank's collectives made (``allocsim.nccl``)."""
        per_node = _from_env("LOCAL_WORLD_SIZE", self.facts.world_size)
        log = self.communicators
        self.facts.send("communicators", communicators=log.to_fact(per_node), dropped=log.dropped)

    # ------------------------------------------------------------------ object collectives
    @staticmethod
    def _all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
        for i in range(len(object_list)):
            object_list[i] = copy_object(obj)

    @staticmethod
    def _gather_object(obj: Any, object_gather_list: list | None = None, dst: Any = None, group: Any = None,
                       group_dst: Any = None) -> None:
        if object_gather_list is not None:
            for i in range(len(object_gather_list)):
                object_gather_list[i] = copy_object(obj)

    @staticmethod
    def _broadcast_object_list(object_list: list, src: Any = None, group: Any = None, device: Any = None,
                               group_src: Any = None) -> None:
        return None

    @staticmethod
    def _scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                             src: Any = None, group: Any = None, group_src: Any = None) -> None:
        if scatter_object_input_list:
            index = min(dist.get_rank(group) if group is not None else dist.get_rank(),
                        len(scatter_object_input_list) - 1)
            scatter_object_output_list[0] = copy_object(scatter_object_input_list[max(index, 0)])

    @staticmethod
    def _send_object_list(object_list: list, dst: Any = None, group: Any = None, device: Any = None,
                          group_dst: Any = None, use_batch: bool = False) -> None:
        return None

    @staticmethod
    def _recv_object_list(object_list: list, src: Any = None, group: Any = None, device: Any = None,
                          group_src: Any = None, use_batch: bool = False) -> int:
        return int(src) if src is not None else 0

    # ------------------------------------------------------------------ ranks the script starts
    def _spawn(self) -> Any:
        hooks = self

        def start_processes(fn: Any, args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
                            start_method: str = "spawn") -> Any:
            if hooks.in_rank:
                raise RuntimeError("allocsim capture: a rank started its own ranks with torch.multiprocessing.spawn; "
                                   "only the script's first level of ranks can be captured")
            hooks.facts.spawn(int(nprocs), hooks.spawn_index, "torch.multiprocessing.spawn")
            if hooks.spawn_index < int(nprocs):
                hooks.in_rank = True
                try:
                    fn(hooks.spawn_index, *args)
                finally:
                    hooks.in_rank = False
            return None if join else _SpawnContext(int(nprocs))

        def spawn(fn: Any, args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
                  start_method: str = "spawn") -> Any:
            return start_processes(fn, args, nprocs, join, daemon, start_method)
        return spawn, start_processes

    def _process_start(self, original: Any) -> Any:
        hooks = self

        def start(process: Any) -> None:
            target = getattr(process, "_target", None)
            module = getattr(target, "__module__", "") or ""
            if target is None or hooks.in_rank or module.split(".")[0] in ("torch", "multiprocessing", "concurrent"):
                return original(process)           # a DataLoader worker, a library's helper: a real process
            if hooks.launching is None:
                # processes started before any process group exists are the job's ranks; a script
                # that is a rank already (torchrun) starts helpers
                hooks.launching = not dist.is_initialized()
            if not hooks.launching:
                return original(process)
            index = hooks.processes_started
            hooks.processes_started += 1
            hooks.facts.spawn(index + 1, hooks.spawn_index, "multiprocessing.Process")   # ranks started so far
            code = 0
            if index == hooks.spawn_index:
                hooks.in_rank = True
                try:
                    process.run()
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                finally:
                    hooks.in_rank = False
            process._popen = _DonePopen(code)
            process._sentinel = None
        return start

    # ------------------------------------------------------------------ pipeline stages, DTensor shards
    def _stage_init(self, original: Any) -> Any:
        hooks = self

        def __init__(stage: Any, submodule: Any, stage_index: int, num_stages: int, *args: Any, **kwargs: Any) -> None:
            original(stage, submodule, stage_index, num_stages, *args, **kwargs)
            group = getattr(stage, "group", None)
            try:
                ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
            except (RuntimeError, ValueError):
                ranks = [dist.get_rank()]
            hooks.facts.stage(stage_index, num_stages, ranks)
        return __init__

    def note_layout(self, spec: Any) -> None:
        """Keep ``spec`` (a DTensor's layout) when its shards are uneven: those ranks may differ."""
        mesh = spec.mesh
        key = (id(mesh), spec.placements, tuple(spec.shape))
        if key in self._layouts or len(self._layouts) >= MAX_LAYOUTS_CHECKED:
            return
        shape = tuple(spec.shape)
        parts: dict[int, int] = {}
        for mesh_dim, placement in enumerate(spec.placements):
            if placement.is_shard():
                dim = placement.dim if placement.dim >= 0 else placement.dim + len(shape)
                parts[dim] = parts.get(dim, 1) * mesh.size(mesh_dim)
        uneven = any(shape[dim] % n for dim, n in parts.items())
        self._layouts[key] = uneven
        if not uneven:
            return
        slices = mesh._layout.remap_to_tensor(mesh._rank_map).reshape(-1, mesh.size()).tolist()
        self.facts.uneven_shard((tuple(map(tuple, slices)), tuple(spec.placements), shape),
                                (slices, tuple(mesh.shape), tuple(spec.placements), shape))

    def _dtensor_new(self, original: Any) -> Any:
        hooks = self

        def __new__(cls: Any, local_tensor: Any, spec: Any, *, requires_grad: bool) -> Any:
            out = original(cls, local_tensor, spec, requires_grad=requires_grad)
            hooks.note_layout(spec)
            return out
        return staticmethod(__new__)

    def _shapes_only(self, original: Any) -> Any:
        """DTensor's shape propagation runs the operator on fake tensors: nothing it makes is a device request."""
        tracker = self.tracker

        def propagate(propagator: Any, op_schema: Any) -> Any:
            with tracker.host():
                return original(propagator, op_schema)
        return propagate

    def _named(self, fn: Any, category: str = "communication") -> Any:
        """``fn`` whose device requests are ``category`` (a collective's buffers: ``communication``)."""
        tracker = self.tracker

        def named(*args: Any, **kwargs: Any) -> Any:
            with tracker.named(category):
                return fn(*args, **kwargs)
        named.__name__ = getattr(fn, "__name__", category)
        return named

    def _ddp_patches(self) -> list[tuple[Any, str, Any]]:
        """DDP's gradient buckets and the flattened parameters it broadcasts at construction
        (``DistributedDataParallel.__init__``) and its buckets rebuilt after the first iteration
        (``_pre_forward``) are ``communication``."""
        import torch.nn.parallel.distributed as ddp_module  # noqa: PLC0415

        ddp = ddp_module.DistributedDataParallel
        return [(ddp, "__init__", self._named(ddp.__init__)), (ddp, "_pre_forward", self._named(ddp._pre_forward))]

    def _fsdp_group_patches(self) -> list[tuple[Any, str, Any]]:
        """FSDP2's all-gather and reduce-scatter buffers (``foreach_all_gather``, ``foreach_reduce`` as
        ``_fsdp_param_group`` calls them) are ``communication``; the unsharded parameters the all-gather
        is copied out into (``foreach_all_gather_copy_out``) are ``parameter``."""
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group_mod  # noqa: PLC0415

        out = [(group_mod, name, self._named(getattr(group_mod, name))) for name in ("foreach_all_gather",
                                                                                    "foreach_reduce")
               if hasattr(group_mod, name)]
        if hasattr(group_mod, "foreach_all_gather_copy_out"):
            out.append((group_mod, "foreach_all_gather_copy_out",
                        self._named(group_mod.foreach_all_gather_copy_out, "parameter")))
        return out

    def _stage_patches(self) -> list[tuple[Any, str, Any]]:
        """A pipeline stage is a fact; its receive buffers (``_make_tensor_from_meta``) are ``communication``."""
        from torch.distributed.pipelining import stage as stage_mod  # noqa: PLC0415

        out = [(stage_mod._PipelineStageBase, "__init__", self._stage_init(stage_mod._PipelineStageBase.__init__))]
        if hasattr(stage_mod, "_make_tensor_from_meta"):
            out.append((stage_mod, "_make_tensor_from_meta", self._named(stage_mod._make_tensor_from_meta)))
        return out

    def _dtensor_patches(self) -> list[tuple[Any, str, Any]]:
        from torch.distributed.tensor._api import DTensor  # noqa: PLC0415

        return [(DTensor, "__new__", self._dtensor_new(DTensor.__new__))]

    def _propagator_patches(self) -> list[tuple[Any, str, Any]]:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator  # noqa: PLC0415

        return [(ShardingPropagator, "_propagate_tensor_meta_non_cached",
                 self._shapes_only(ShardingPropagator._propagate_tensor_meta_non_cached))]

    def finish(self) -> None:
        """Send the facts learned at the end (the communicators used, the ranks whose shards differ)."""
        if self.facts.rank is not None or dist.is_initialized():
            self._send_communicators()
        if not self.facts.has_uneven:
            return
        try:
            from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset  # noqa: PLC0415
        except ImportError:
            return

        def local_shape(shape: tuple, mesh_shape: tuple, placements: tuple, coordinate: list[int]) -> tuple:
            return tuple(_compute_local_shape_and_global_offset(shape, mesh_shape, coordinate, placements,
                                                                skip_offset=True)[0])
        self.facts.finish(local_shape)

    # ------------------------------------------------------------------ install
    @contextlib.contextmanager
    def installed(self) -> Iterator["RankHooks"]:
        """Apply every patch for the block (those of DTensor, FSDP2 and pipelining when the script imports
        them: ``lazy``); the facts learned at the end are sent when it exits."""
        from . import deepspeed, fsdp, megatron, pipelining  # noqa: PLC0415
        from .lazy import Patches  # noqa: PLC0415

        os.environ.setdefault("TORCH_DIST_INIT_BARRIER", "0")
        register_backend()
        init = self._init_process_group(c10d.init_process_group)
        new_group = self._patched_new_group = self._new_group(c10d.new_group)
        split_group = self._split_group()
        get_backend = self._get_backend(c10d.get_backend)
        spawn, start_processes = self._spawn()
        batch = self._batch_isend_irecv(c10d.batch_isend_irecv)
        AnsweringGroup.communicators = self.communicators
        AnsweringGroup.broadcasts = self._broadcast_log()
        self.tracker.operator_hook = self._note_operator
        table: list[tuple[Any, str, Any]] = []
        for module in (dist, c10d):
            table.append((module, "batch_isend_irecv", batch))
            table += [(module, "init_process_group", init), (module, "new_group", new_group),
                      (module, "split_group", split_group), (module, "is_nccl_available", lambda: True),
                      (module, "get_backend", get_backend),
                      (module, "all_gather_object", self._all_gather_object),
                      (module, "gather_object", self._gather_object),
                      (module, "broadcast_object_list", self._broadcast_object_list),
                      (module, "scatter_object_list", self._scatter_object_list),
                      (module, "send_object_list", self._send_object_list),
                      (module, "recv_object_list", self._recv_object_list)]
        if hasattr(dist, "_verify_params_across_processes"):
            # DDP's check that every rank holds the same parameters reads their shapes back from a
            # device all-gather; one rank alone holds them by construction
            table.append((dist, "_verify_params_across_processes", lambda *args, **kwargs: None))
        import torch.multiprocessing as tmp  # noqa: PLC0415

        spawn_module = sys.modules.get("torch.multiprocessing.spawn")
        for owner in (tmp, spawn_module):
            if owner is not None and not isinstance(getattr(owner, "spawn", None), type(sys)):
                table += [(owner, "spawn", spawn), (owner, "start_processes", start_processes)]
        table.append((mp_process.BaseProcess, "start", self._process_start(mp_process.BaseProcess.start)))
        # torch.cuda.nccl.version(): the NCCL the CUDA wheel of this torch bundles (a CPU build has none;
        # torchtune's bf16 check and DeepSpeed read it); allocsim.nccl has the table
        import torch.cuda.nccl as cuda_nccl  # noqa: PLC0415

        from ...nccl import nccl_version_for_torch  # noqa: PLC0415

        bundled = nccl_version_for_torch(torch.__version__)
        table += [(cuda_nccl, "version", lambda: bundled), (cuda_nccl, "is_available", lambda tensors: True)]
        # torch.distributed finds a device's module by its type name (device_mesh._get_device_handle:
        # getattr(torch, device.type)); the capture's device tensors are on meta and stand for cuda
        table.append((torch, "meta", torch.cuda))
        patches = Patches()
        patches.apply(table)

        def mesh_patches() -> list[tuple[Any, str, Any]]:
            import torch.distributed.device_mesh as device_mesh  # noqa: PLC0415

            out = [(device_mesh, name, value) for name, value in (
                ("init_process_group", init), ("new_group", new_group), ("split_group", split_group),
                ("get_backend", get_backend)) if hasattr(device_mesh, name)]
            return out

        patches.when_imported("torch.distributed.device_mesh", mesh_patches)
        patches.when_imported("torch.nn.parallel.distributed", self._ddp_patches)
        patches.when_imported("torch.distributed.fsdp._fully_shard._fsdp_init", lambda: fsdp.patches(self.tracker))
        patches.when_imported("torch.distributed.fsdp._fully_shard._fsdp_param_group",
                              lambda: fsdp.group_patches(self.tracker) + self._fsdp_group_patches())
        patches.when_imported("torch.distributed.pipelining.stage", self._stage_patches)
        patches.when_imported("torch.distributed.pipelining.schedules",
                              lambda: pipelining.patches(self, self.messages, self.relay))
        patches.when_imported("torch.distributed.tensor._op_schema", fsdp.op_schema_patches)
        patches.when_imported("torch.distributed.tensor._random", fsdp.random_patches)
        patches.when_imported("torch.distributed.tensor._api", self._dtensor_patches)
        patches.when_imported("deepspeed.ops.op_builder.builder", deepspeed.patches)
        patches.when_imported("deepspeed.runtime.zero.utils", deepspeed.zero_utils_patches)
        patches.when_imported("deepspeed.ops.adam.cpu_adam", deepspeed.cpu_adam_patches)
        patches.when_imported("megatron.legacy.fused_kernels", megatron.patches)
        patches.when_imported("megatron.core.parallel_state", lambda: megatron.parallel_state_patches(self))
        patches.when_imported("torch.distributed.tensor._sharding_prop", self._propagator_patches)
        try:
            yield self
        finally:
            patches.undo()
            AnsweringGroup.communicators = None
            AnsweringGroup.broadcasts = None
            self.tracker.operator_hook = None
            try:
                self.finish()
            except Exception as exc:  # noqa: BLE001  (a fact is a hint for the roles rule, never the run's end)
                self.facts.send("error", text=f"{type(exc).__name__}: {exc}"[:300])


__all__ = ["AnsweringGroup", "RankHooks"]
