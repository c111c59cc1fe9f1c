"""``Trainer``: one rank's share of a plan, ready to train inside torch.distributed.

Every rank builds the model from the same seed, traces it, cuts the traced graph by the plan
into pieces, keeps its own pieces and the parameters they use, and runs the schedule the
simulator predicts. A model built without its weights (what every worker builds) gets only
this rank's parameters allocated, with the values the whole model
would have (``materialise``; a tensor-parallel rank's shards cut from them), so its weights
equal single-process training's either way. The
parallelisms the plan uses (:mod:`outcore.parallel`: tensor, spatial, sharding, replicas) take
their part at fixed steps of that sequence; the pieces run on the runtime core
(:mod:`outcore.core`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from outcore.core.comm import Messenger
from outcore.core.executor import RankExecutor, StepResult
from outcore.core.modules import (
    BUILD_BATCH_FLOOR,
    adopt_values,
    build_batches,
    build_piece_modules,
    greedy_groups,
    module_params,
    param_aliases,
    params_without_storage,
    prune_unowned,
    saved_buffers,
)
from outcore.core.randomness import set_shards
from outcore.core.values import local, value_metas
from outcore.errors import PlanError
from outcore.graph.capture import retrace
from outcore.graph.coarsen import collapse, groups
from outcore.graph.ir import Graph
from outcore.hardware.memtrack import MemoryTracker
from outcore.hardware.precision import LossScaler, autocast, canonical
from outcore.parallel import Parallelism, RankBuild, active as active_parallelisms
from outcore.parallel.replicas import StatGroup, sync_running_stats
from outcore.parallel.sharding import sharded_names
from outcore.plan.plan import Plan, fingerprint, graph_ref
from outcore.plan.policies import MemoryPolicies
from outcore.plan.replicas import fx_name
from outcore.runtime.data import default_loss, split
from outcore.schedule.io import adopt
from outcore.schedule.lower import Lowered, lower

log = logging.getLogger(__name__)


def _first_difference(traced: list[str], planned: list[str]) -> str:
    """Where two lists of node names first differ, in words."""
    for i, (a, b) in enumerate(zip(traced, planned)):
        if a != b:
            return f"node {i} is {a} here, {b} in the graph"
    return f"{len(traced)} nodes here, {len(planned)} in the graph"


def layer_plan(fine: Graph, plan: Plan) -> Plan:
    """``plan`` on the layer-level nodes of ``fine`` (a plan may be made at any collapse depth
    of the graph): assignment and memory-policy groups of every layer."""
    depth = plan.graph.get("depth")
    if depth is None:
        return plan
    group, _ = groups(fine, int(depth))
    coarse = collapse(fine, int(depth))
    fp = plan.graph.get("fingerprint")
    if fp and fp != fingerprint(coarse):
        raise PlanError(f"the plan was made for another model or depth (graph "
                        f"{plan.graph.get('name')!r}, depth {depth}); re-plan this model")
    if plan.assignment.shape[0] != coarse.num_nodes:
        raise PlanError(f"the plan places {plan.assignment.shape[0]} nodes, the model has "
                        f"{coarse.num_nodes} at depth {depth}: re-plan this model")
    pol = plan.policies
    sp = plan.spatial.on_fine(fine, group, coarse) if plan.spatial is not None else None
    return plan.replace(assignment=plan.assignment[group], node_ids=fine.ids.copy(),
                        graph=graph_ref(fine), spatial=sp,
                        policies=None if pol is None else MemoryPolicies(pol.group_of[group],
                                                                         pol.policies))


def lower_for_training(graph: Graph, plan: Plan, *, microbatches: int, schedule: str,
                       mb_samples: int | None,
                       schedule_doc: dict[str, Any] | None = None) -> Lowered:
    """The schedule every rank runs: the plan lowered on layer-level nodes (the same
    :func:`~outcore.schedule.lower.lower` the simulator uses), or a schedule file's action
    lists checked against it."""
    low = lower(graph, layer_plan(graph, plan), microbatches=microbatches, schedule=schedule,
                mb_samples=mb_samples if graph.batch_size else None)
    return adopt(low, schedule_doc) if schedule_doc is not None else low


def _leaf_metas(pieces: Any, metas: dict[str, Any], big_names: list[str]
                ) -> Callable[[int, str], list[Any]]:
    """Per transfer and direction, the tensor metas of its message (backward: only the
    differentiable ones carry gradients)."""
    transfers = pieces.transfers

    def leaf_metas(t: int, direction: str) -> list[Any]:
        out = []
        for i in transfers[t].tensors:
            leaves = metas[fx_name(big_names[i])].tensor_leaves()
            out += leaves if direction == "F" else [m for m in leaves if m.differentiable]
        return out
    return leaf_metas


@dataclass
class StepReport:
    loss: float
    peak_bytes: int
    busy_s: float
    events: list


class Trainer:
    """This rank's part of a plan (see module docstring).

    Args:
        model: the whole model, freshly built with the run's seed (not modified in place beyond
            dropping parameters this rank does not use).
        graph: the layer-level graph of ``model`` (from :func:`outcore.capture`, with costs);
            the same on every rank.
        plan: the plan (``plan.devices`` must equal the world size).
        microbatches: micro-batches per step.
        micro_inputs: example inputs of one micro-batch (shapes for receive buffers); the
            global batch is ``micro * microbatches * copies`` where ``copies`` is the plan's
            replicas times its data-parallel degree (1 for a plain plan).
        schedule: ``gpipe``, ``1f1b`` or ``auto`` (the plan's).
        loss_fn: ``loss_fn(output, target)``; default: cross-entropy / MSE.
        optimizer: ``optimizer(params) -> torch.optim.Optimizer`` (default Adam, lr 1e-3).
        lr_scheduler: ``lr_scheduler(optimizer) -> scheduler`` stepped once per step, or None.
        device: this rank's device.
        timeout_s: longest wait for any message or collective.
        track_memory: measure peak tensor memory of each step.
        schedule_doc: a schedule file's document (``outcore-schedule/1``) whose action lists
            to run instead of the freshly lowered ones (checked against them).
        materialise: for a ``model`` built without its weights
            (:func:`outcore.zoo.weightless.weightless`): ``materialise(names)`` returns the model
            with (at least) the parameters ``names`` real, as the whole model built with the
            run's seed has them; this rank's parameters and buffers take its values.
        precision: ``32``, ``bf16-mixed`` or ``16-mixed`` (``outcore.hardware.precision``):
            every piece's forward and loss run under autocast; 16-mixed scales the loss.
    """

    def __init__(self, model: nn.Module, graph: Graph, plan: Plan, *, microbatches: int,
                 micro_inputs: tuple[torch.Tensor, ...], schedule: str = "auto",
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 optimizer: Callable[[list[nn.Parameter]], Any] | None = None,
                 lr_scheduler: Callable[[Any], Any] | None = None,
                 device: torch.device | None = None, timeout_s: float = 60.0,
                 track_memory: bool = True, schedule_doc: dict[str, Any] | None = None,
                 materialise: Callable[[list[str]], nn.Module] | None = None,
                 precision: str = "32", build_batch_bytes: int | None = None):
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        if plan.devices != self.world:
            raise PlanError(f"the plan is for {plan.devices} devices but {self.world} processes "
                            f"are running: start {plan.devices} workers, or re-plan for "
                            f"{self.world}")
        self.device = device or torch.device("cpu")
        self.microbatches = microbatches
        self.track_memory = track_memory
        self.precision = canonical(precision)
        self.scaler = LossScaler() if self.precision == "16-mixed" else None
        self.start_weights: str | None = None  # a weights file the run starts from (worker)
        # tensor parallelism: process ``slot * tp + t`` runs slot ``slot``'s actions on shard t
        self.tp = plan.layout.tp
        self.slot, self.shard = divmod(self.rank, self.tp)
        plan = layer_plan(graph, plan)
        build = RankBuild(rank=self.rank, world=self.world, slot=self.slot, shard=self.shard,
                          plan=plan, graph=graph, model=model,
                          micro_inputs=tuple(micro_inputs), device=self.device,
                          timeout_s=timeout_s)
        parallelisms = active_parallelisms(plan, self.world)
        for par in parallelisms:
            par.on_model(build)
        gm = build.gm = retrace(model, tuple(micro_inputs), graph.meta).gm
        set_shards(0, 1, {}, 0)  # no value is split (tensor parallelism says otherwise)
        traced = [n.name for n in gm.graph.nodes]
        planned = [graph.name_of(i) for i in range(graph.num_nodes)]
        if traced != planned:
            where = _first_difference(traced, planned)
            raise PlanError(f"the graph does not match the model's trace ({where}): "
                            "capture the graph from this model (same options) and plan "
                            "again; if it was, the model traces differently in each process "
                            "(a set of strings iterated in hash order: set PYTHONHASHSEED=0 "
                            "before starting Python)")
        for par in parallelisms:
            par.on_trace(build)
        low = build.lowered = lower_for_training(
            graph, plan, microbatches=microbatches,
            schedule=plan.schedule if schedule == "auto" else schedule,
            mb_samples=micro_inputs[0].shape[0], schedule_doc=schedule_doc)
        self.lowered = low
        self.assignment, self.copies = low.assignment, low.copies
        self.schedule, self.costs, self.pieces = low.schedule, low.costs, low.pieces
        metas = value_metas(gm, micro_inputs, precision=self.precision, device=self.device)
        big_names = [low.graph.name_of(i) for i in range(low.graph.num_nodes)]
        modules = build.modules = build_piece_modules(gm, big_names, low.pieces, self.slot,
                                                      metas)
        for par in parallelisms:
            par.on_pieces(build)
        self._keep_parameters(build, parallelisms, optimizer, lr_scheduler, materialise,
                              build_batch_bytes)
        # what the parallelisms made, which the steps and the worker read
        self.tensor_layout = build.made.get("tensor")
        self.spatial = build.made.get("spatial")  # the tiled layers (outcore.parallel.spatial)
        self.sharder = build.made.get("sharding")  # FSDP-style shards over the copies
        self.placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        ops = [low.graph.op_of(i) for i in range(low.graph.num_nodes)]
        mine = [int(d) == self.slot for d in low.assignment]
        self.needs_inputs = any(m and op == "input" for m, op in zip(mine, ops)) or \
            bool(self.spatial and self.spatial.is_extra)
        self.needs_targets = any(m and op == "output" for m, op in zip(mine, ops))
        self.step_index = 0
        self.messenger = Messenger(self.slot, self.schedule,
                                   _leaf_metas(low.pieces, metas, big_names), self.device,
                                   timeout_s, use_tags=dist.get_backend() != "nccl"
                                   if dist.is_initialized() else True,
                                   step_of=lambda: self.step_index,
                                   process_of=lambda slot: slot * self.tp + self.shard)
        self.policies = {p.id: self.costs.policies[p.id] for p in low.pieces.pieces
                         if p.device == self.slot and self.costs.policies
                         and self.costs.policies[p.id] != "none"}
        piece_params = {pm.id: module_params(pm.module) for pm in modules
                        if pm.id in self.policies}
        self.executor = RankExecutor(
            self.slot, self.schedule, {pm.id: pm for pm in modules}, big_names, metas,
            self.messenger, loss_fn or default_loss, self.optimizer, self._buckets(),
            self.placeholders, self.device, on_step=self._after_optimizer, copies=self.copies,
            policies=self.policies, piece_params=piece_params, sharder=self.sharder,
            precision=self.precision, scaler=self.scaler)
        # a scaled loss needs every rank's verdict on the step's gradients
        self.executor.guard_nonfinite = self.scaler is not None
        if self.sharder is not None:  # its gathers and reduce-scatters in the traced step
            self.sharder.log = self.executor.collectives
        # every shard of a tensor-parallel slot computes the same loss: count it once
        self.executor.count_loss = self.shard == 0
        self.buffer_groups: list[StatGroup] = []
        # context managers a traced step runs in (a parallelism timing its collectives)
        self.traced_steps: list[Callable[[Any], Any]] = []
        for par in parallelisms:
            par.on_trainer(self)

    def _keep_parameters(self, build: RankBuild, parallelisms: list[Parallelism],
                         optimizer: Any, lr_scheduler: Any,
                         materialise: Callable[[list[str]], nn.Module] | None,
                         batch_bytes: int | None = None) -> None:
        """Drop the parameters no piece of this rank uses, move the rest to the device, let
        the parallelisms change them (sharding), and make the optimizer (and learning-rate
        scheduler) over them."""
        gm = build.gm
        self.aliases = build.aliases = param_aliases(gm)  # tied weights: one name on every rank
        # the parameter bytes this rank allocated to build the model: all of them (counted
        # before the unused ones are dropped), or (built without weights) its part's, in its
        # largest build
        self.built_bytes = _real_bytes(build.model)
        kept = prune_unowned(gm, build.modules + build.extra_modules)
        roots = [gm] + [pm.module for pm in build.modules + build.extra_modules]
        later: list[str] = []  # a sharded rank's sharded parameters: built once it shards
        if materialise is not None:  # built without weights: this rank's, with values
            if self.tp == 1 and build.plan.layout.depth > 1:
                sharded = sharded_names(build)
                later = [k for k in kept if self.aliases.get(k, k) in sharded]
                params_without_storage(roots, later, self.device)
            # a tensor-parallel rank cuts its shards group by group (one build each), so it
            # never holds its slot's split layers whole at once
            deferred = set(later)
            now = [k for k in kept if k not in deferred]
            groups = build_batches(gm, now, batch_bytes)
            if len(groups) > 1:
                log.info("rank %d builds its tensor-parallel shards in %d passes", self.rank,
                         len(groups))
            self.built_bytes = 0
            for i, names in enumerate(groups):
                source = materialise(names)
                self.built_bytes = max(self.built_bytes, _real_bytes(source))
                adopt_values(roots, source, names, buffers=i == 0)
                del source
        # move what this rank keeps; dropped tensors stay on the meta device
        gm._apply(lambda t: t if t.device.type == "meta" else t.to(self.device))
        self.gm = gm
        params = dict(gm.named_parameters(remove_duplicate=False))
        self.named_params = build.named_params = {self.aliases.get(k, k): params[k]
                                                  for k in kept}
        build.params = [p for p in self.named_params.values() if p.requires_grad]
        for par in parallelisms:
            par.on_parameters(build)
        if later:
            self._build_shards(build, materialise, later, batch_bytes)
        self.params = build.params
        make_opt = optimizer or (lambda ps: torch.optim.Adam(ps, lr=1e-3))
        self.optimizer = make_opt(self.params) if self.params else None
        self.lr_scheduler = lr_scheduler(self.optimizer) if (lr_scheduler and self.optimizer) \
            else None

    def _build_shards(self, build: RankBuild, materialise: Callable[[list[str]], nn.Module],
                      names: list[str], batch_bytes: int | None) -> None:
        """Give a sharded rank's shards their values: its sharder's units built a group at a
        time (each group's whole parameters about this rank's share of them, at least
        :data:`~outcore.core.modules.BUILD_BATCH_FLOOR`), each group's shards cut before the
        next is built."""
        sharder = build.made["sharding"]
        wanted_names = set(names)
        units = [u for u in sharder.units if wanted_names.intersection(u.names)]
        sizes = [u.size * sharder.depth * u.shard.element_size() for u in units]
        budget = batch_bytes if batch_bytes is not None else \
            max(sum(sizes) // sharder.depth, BUILD_BATCH_FLOOR)
        for group in greedy_groups(units, sizes, budget):
            wanted = [n for u in group for n in u.names]
            source = materialise(wanted)
            self.built_bytes = max(self.built_bytes, _real_bytes(source))
            params = dict(source.named_parameters(remove_duplicate=False))
            sharder.load_values({n: params[n].detach() for n in wanted})
            del source, params

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's parameters by name, whole (sharded ones gathered: collective)."""
        out = {k: v.detach() for k, v in self.named_params.items()}
        if self.sharder is not None:
            out.update(self.sharder.parameters())
        return out

    def load_parameters(self, values: dict[str, torch.Tensor]) -> None:
        """Set this rank's parameters from whole values by name (a checkpoint)."""
        with torch.no_grad():
            for k, p in self.named_params.items():
                if self.sharder is None or not self.sharder.sharded(p):
                    p.copy_(values[k])
        if self.sharder is not None:
            self.sharder.load_parameters(values)

    def _buckets(self) -> dict[int, tuple[Any, list[nn.Parameter]]]:
        """This rank's all-reduce buckets: process group and parameters (every rank creates
        every group, in one order). A bucket's group is of slots; with tensor parallelism
        shard ``t`` of every slot in it all-reduces its own shard's gradients."""
        buckets = {}
        for b, group in enumerate(self.schedule.buckets):
            pgs = [dist.new_group([s * self.tp + t for s in group]) if dist.is_initialized()
                   else None for t in range(self.tp)]
            pg = pgs[self.shard]
            if self.slot in group:
                names = [self.aliases.get(n, n) for n in self.schedule.meta["bucket_params"][b]]
                buckets[b] = (pg, [self.named_params[n] for n in names
                                   if n in self.named_params])
        return buckets

    def sync_running_stats(self) -> None:
        """Average the batch-norm running statistics over the replicas that hold them (each
        replica saw different micro-batches), so that every rank, every checkpoint and the
        trained model agree (:mod:`outcore.parallel.replicas`)."""
        sync_running_stats(self.buffer_groups)

    def _after_optimizer(self) -> None:
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def baseline_tensors(self) -> list[torch.Tensor]:
        """Tensors alive between steps: parameters, gradients, buffers, optimizer state."""
        out = [p for p in self.gm.parameters() if p.device.type != "meta"]
        out += [b for b in self.gm.buffers() if b.device.type != "meta"]
        if self.optimizer is not None:
            for st in self.optimizer.state.values():
                out += [v for v in st.values() if isinstance(v, torch.Tensor)]
        if self.sharder is not None:
            out += self.sharder.shards
        return [local(t) for t in out]  # a tensor-parallel shard's own storage

    def on_device(self, inputs: tuple[torch.Tensor, ...] | None, targets: Any
                  ) -> tuple[tuple[torch.Tensor, ...] | None, Any]:
        """The parts of a batch this rank reads, on its device: on a GPU copied from pinned
        memory without waiting, so the copy overlaps what the device still runs of the step
        before (a data loader's job, kept out of the step as a plain loop keeps it)."""
        def move(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or x.device == self.device:
                return x
            if self.device.type == "cuda" and x.device.type == "cpu":
                return x.pin_memory().to(self.device, non_blocking=True)
            return x.to(self.device)
        if inputs is not None and self.needs_inputs:
            inputs = tuple(move(x) for x in inputs)
        if targets is not None and self.needs_targets:
            from torch.utils._pytree import tree_map
            targets = tree_map(move, targets)
        return inputs, targets

    def step(self, inputs: tuple[torch.Tensor, ...] | None, targets: Any, *,
             trace: bool = False, track_memory: bool | None = None) -> StepReport:
        """One training step on a global batch; returns the global loss (on every rank).

        ``track_memory`` (default: the trainer's setting) measures this step's peak tensor
        memory; on CPU the tracker hooks every operator, which slows small models."""
        chunks = self.microbatches * self.copies
        micro_in = split(tuple(x.to(self.device) for x in inputs), chunks) \
            if (self.needs_inputs and inputs is not None) else None
        micro_tg = split(_to(targets, self.device), chunks) \
            if (self.needs_targets and targets is not None) else None
        self.executor.trace = trace
        with contextlib.ExitStack() as timing:
            for make in self.traced_steps if trace else ():
                timing.enter_context(make(self.executor.collectives))
            if self.track_memory if track_memory is None else track_memory:
                with MemoryTracker(self.device, self.baseline_tensors()) as mt:
                    result: StepResult = self._run_step(micro_in, micro_tg)
                peak = mt.peak_bytes
            else:
                result = self._run_step(micro_in, micro_tg)
                peak = 0
        loss = self.executor.step_loss  # summed over the ranks by the non-finite check
        if loss is None:
            mine = result.loss if result.loss is not None and self.executor.count_loss else 0.0
            loss = float(self.messenger.sum_over_ranks([mine])[0])
        self.step_index += 1
        return StepReport(loss, peak, result.busy_s, result.events)

    def _run_step(self, micro_in: Any, micro_tg: Any) -> StepResult:
        extra = self.spatial is not None and self.spatial.is_extra
        t0 = time.perf_counter()
        if extra:  # an extra tile rank: its tiles, then the step its schedule has no OPT for
            self.executor.collectives.start(self.executor.trace)  # the tiles' communication
            self.spatial.run_tiles(micro_in, lambda: autocast(self.precision, self.device))
        tiles_s = time.perf_counter() - t0
        result = self.executor.run_step(micro_in, micro_tg, since=t0 if extra else None)
        result.busy_s += tiles_s
        if extra and self.optimizer is not None:
            self.executor.apply_update(any(self.executor.nonfinite or ()))
            self._after_optimizer()
        return result

    def state_dict(self) -> dict[str, Any]:
        """This rank's parameters, buffers, optimizer and scheduler state (by parameter name)."""
        state: dict[str, Any] = {"model": self.full_parameters()}
        state["buffers"] = {k: b for k, b in saved_buffers(self.gm) if b.device.type != "meta"}
        if self.optimizer is not None:
            index = {id(p): k for k, p in self.named_params.items()}
            opt = self.optimizer.state_dict()
            order = [index.get(id(p)) for group in self.optimizer.param_groups
                     for p in group["params"]]
            by_name = {order[i]: v for i, v in opt["state"].items() if order[i] is not None}
            if self.sharder is not None:  # the shards' state, whole and by parameter name
                by_name.update(self.sharder.optimizer_state(self.optimizer.state))
            state["optim"] = {"state": by_name, "param_groups": opt["param_groups"]}
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state


def _real_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters that have storage (not on ``meta``, not fake)."""
    from torch._subclasses.fake_tensor import is_fake
    return sum(p.numel() * p.element_size() for p in model.parameters()
               if p.device.type != "meta" and not is_fake(p))


def _to(value: Any, device: torch.device) -> Any:
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, value)
