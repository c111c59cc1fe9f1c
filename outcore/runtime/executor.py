"""Execute one rank's action list for one training step.

``F(p, m)``: run piece ``p`` on micro-batch ``m``; its inputs come from the data (model inputs),
from another piece of this rank (detached, so each piece keeps its own autograd graph), or from a
received message; the loss of a piece holding the model output is ``loss_fn(output, target) / M``.
``B(p, m)``: one ``torch.autograd.backward`` over the piece's outputs with the gradients its
consumers returned (and its loss); the gradients of its inputs then go back to their producers.
Sends, receives, all-reduces and the optimizer step are the schedule's other actions.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from outcore.errors import RuntimeFailure
from torch.utils.checkpoint import checkpoint

from outcore.runtime.comm import Messenger
from outcore.runtime.offload import ActivationOffloader, ParamOffloader, frozen_running_stats
from outcore.runtime.modules import PieceModule
from outcore.plan.replicas import copy_of, fx_name
from outcore.runtime.randomness import set_context as set_random_context
from outcore.runtime.values import ValueMeta, tensors_of
from outcore.schedule.ir import Action, Schedule
from outcore.trace import Event

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    loss: float | None  # sum over this rank's micro-batch losses (already divided by M)
    events: list[Event] = field(default_factory=list)
    busy_s: float = 0.0


class RankExecutor:
    """Runs a rank's actions (see module docstring).

    Args:
        rank: this rank.
        schedule: the schedule all ranks execute.
        modules: this rank's piece modules by piece id.
        names: fx node name of each graph node index.
        metas: value meta of every fx node at the micro-batch size.
        messenger: point-to-point messages.
        loss_fn: ``loss_fn(output, target) -> scalar``.
        optimizer: steps this rank's parameters; ``None`` = no step (evaluation, tests).
        bucket_groups: process group and parameters of each all-reduce bucket this rank is in.
        placeholders: names of the model's input nodes, in argument order.
        trace: record an :class:`Event` per action.
    """

    def __init__(self, rank: int, schedule: Schedule, modules: dict[int, PieceModule],
                 names: list[str], metas: dict[str, ValueMeta], messenger: Messenger,
                 loss_fn: Callable[[Any, Any], torch.Tensor], optimizer: Any,
                 bucket_groups: dict[int, tuple[Any, list[torch.nn.Parameter]]],
                 placeholders: list[str], device: torch.device, trace: bool = False,
                 on_step: Callable[[], None] | None = None, copies: int = 1,
                 policies: dict[int, str] | None = None,
                 piece_params: dict[int, list[torch.nn.Parameter]] | None = None):
        self.rank, self.s, self.modules = rank, schedule, modules
        self.random_seed = torch.initial_seed()  # the run's seed: random nodes derive theirs
        self.names, self.metas, self.msg = names, metas, messenger
        self.loss_fn, self.optimizer = loss_fn, optimizer
        self.bucket_groups = bucket_groups
        self.placeholders = placeholders
        self.device = device
        self.trace = trace
        self.on_step = on_step
        self.copies = copies  # replicas x data-parallel copies of the graph in the schedule
        self.policies = policies or {}
        self.piece_params = piece_params or {}
        offloaded = [q for p, pol in self.policies.items() if pol == "offload-params"
                     for q in self.piece_params.get(p, [])]
        self.act_off = ActivationOffloader(device)
        self.param_off = ParamOffloader(device, list({id(q): q for q in offloaded}.values()))
        self.pending_ar: list[tuple[Any, torch.Tensor, list[torch.nn.Parameter], int]] = []
        P = schedule.pieces
        self.piece_of_name = {names[i]: int(p) for i, p in enumerate(P.piece_of.tolist())}
        self.transfer_names = [[names[i] for i in t.tensors] for t in P.transfers]
        # for each (producer name, consumer piece) the transfer carrying it
        self.transfer_into: dict[tuple[str, int], int] = {}
        for t in P.transfers:
            for i in t.tensors:
                self.transfer_into[(names[i], t.dst)] = t.id
        # non-finite guard: when on, every rank joins one all-reduce per step (at its OPT, or
        # after its last action) and no rank steps its optimizer if any loss or gradient is
        # NaN or infinite; ``nonfinite`` then holds (loss bad, gradient bad) for the step
        self.guard_nonfinite = False
        self.nonfinite: tuple[bool, bool] | None = None
        self.guard_s = 0.0  # time the last check waited for the other ranks

    def check_finite(self) -> bool:
        """Whether any rank's loss or gradient of this step is NaN or infinite (a collective:
        every rank calls it once per step). Max-norms, so large finite values never overflow."""
        loss_bad = any(not torch.isfinite(v).all() for v in self.losses.values())
        grads = [p.grad for p in self._grad_params() if p.grad is not None]
        grad_bad = bool(grads) and not bool(torch.isfinite(torch.nn.utils.get_total_norm(
            [local(g.detach()) for g in grads], float("inf"))))
        flags = torch.tensor([float(loss_bad), float(grad_bad)], dtype=torch.float64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            t0 = time.perf_counter()
            if self.device.type == "cuda":
                flags = flags.to(self.device)
            dist.all_reduce(flags)
            self.guard_s = time.perf_counter() - t0
        self.nonfinite = (bool(flags[0].item() > 0), bool(flags[1].item() > 0))
        return any(self.nonfinite)

    def _grad_params(self) -> list[torch.nn.Parameter]:
        if self.optimizer is None:
            return []
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    # ------------------------------------------------------------------ per step
    def run_step(self, inputs: list[tuple[torch.Tensor, ...]] | None,
                 targets: list[Any] | None) -> StepResult:
        """Run this rank's actions once. ``inputs``/``targets`` are per chunk of the global batch
        (``copies * microbatches`` chunks; micro-batch ``m`` of copy ``c`` is chunk
        ``c * M + m``); only the ranks holding the model's inputs / output need them."""
        self.inputs, self.targets = inputs, targets
        self.fwd_inputs: dict[tuple[int, int], dict[str, Any]] = {}
        self.fwd_outputs: dict[tuple[int, int], dict[str, Any]] = {}
        self.local: dict[tuple[str, int], Any] = {}
        self.received: dict[tuple[int, str, int], Any] = {}
        self.grad_acc: dict[tuple[str, int], list[torch.Tensor | None]] = {}
        self.send_grads: dict[tuple[int, int], dict[str, list[torch.Tensor]]] = {}
        self.losses: dict[int, torch.Tensor] = {}
        result = StepResult(None)
        self.msg.start_step()
        self.nonfinite = None
        t0 = time.perf_counter()
        acts = self.s.actions[self.rank]
        for k, a in enumerate(acts):
            start = time.perf_counter()
            self._lookahead(acts, k)
            self.guard_s = 0.0
            self.execute(a)
            end = time.perf_counter()
            start += self.guard_s  # waiting for the other ranks' verdict is not work
            if a.op in ("F", "B", "OPT"):
                result.busy_s += end - start
            if self.trace:
                result.events.append(self._event(a, start - t0, end - t0))
        self.msg.flush()
        if self.guard_nonfinite and self.nonfinite is None:  # a rank without an OPT action
            self.check_finite()
        if self.losses:
            result.loss = float(sum(v.item() for v in self.losses.values()))
        return result

    def _lookahead(self, acts: tuple[Action, ...], k: int) -> None:
        """Post the receives of the next few actions early so their data flows meanwhile."""
        for a in acts[k:k + 4]:
            if a.op in ("RF", "RB"):
                self.msg.prepost((a.transfer, a.op[1], a.mb))
            elif a.op == "B" and self.policies.get(a.piece) == "offload-activations":
                self.act_off.prefetch(a.piece, a.mb)

    def _event(self, a: Action, start: float, end: float) -> Event:
        kind = {"SF": "send", "SB": "send", "RF": "recv", "RB": "recv", "AR": "allreduce",
                "OPT": "optim"}.get(a.op, a.op)
        stream = "comm" if a.op in ("SF", "SB", "RF", "RB", "AR") else "compute"
        peer = self.s.peer(self.rank, a) if a.op in ("SF", "SB", "RF", "RB") else -1
        return Event(self.rank, kind, str(a), start, end, stream, a.mb, a.piece, peer=peer)

    def execute(self, a: Action) -> None:
        op = a.op
        if op == "F":
            self.forward(a.piece, a.mb)
        elif op == "B":
            self.backward(a.piece, a.mb)
        elif op == "SF":
            self.send_activations(a.transfer, a.mb)
        elif op == "RF":
            self.recv_activations(a.transfer, a.mb)
        elif op == "SB":
            self.send_gradients(a.transfer, a.mb)
        elif op == "RB":
            self.recv_gradients(a.transfer, a.mb)
        elif op == "AR":
            self.allreduce(a.bucket)
        elif op == "OPT":
            self.finish_allreduces()
            self.param_off.before_step()
            bad = self.check_finite() if self.guard_nonfinite else False
            if self.optimizer is not None:
                if not bad:  # a non-finite step never reaches the parameters
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            if self.on_step is not None:
                self.on_step()
        else:  # pragma: no cover - Action validates ops
            raise RuntimeFailure(f"unknown action {a}")

    # ------------------------------------------------------------------ compute
    def _input_value(self, name: str, piece: int, mb: int) -> tuple[Any, bool]:
        """Value of input ``name`` of ``piece``; second item: it is a fresh autograd leaf."""
        layer = fx_name(name)
        if layer in self.placeholders and self.piece_of_name[name] == piece:
            assert self.inputs is not None, "this rank holds a model input but got no data"
            chunk = copy_of(name) * self.s.microbatches + mb
            return self.inputs[chunk][self.placeholders.index(layer)], False
        tid = self.transfer_into[(name, piece)]
        if not self.s.pieces.transfers[tid].local:
            return self.received[(tid, name, mb)], True
        value = self.local[(name, mb)]
        return _detach_tree(value, self.metas[layer]), True

    def _random_context(self, p: int, mb: int) -> None:
        """Random nodes of piece ``p`` draw for this step and micro-batch chunk."""
        pm = self.modules[p]
        chunk = (copy_of(pm.outputs[0]) if pm.outputs else 0) * self.s.microbatches + mb
        set_random_context(self.random_seed, self.msg.step_of(), chunk)

    def forward(self, p: int, mb: int) -> None:
        pm = self.modules[p]
        self._random_context(p, mb)
        values, leaves, copies = [], {}, []
        for name in pm.inputs:
            v, is_leaf = self._input_value(name, p, mb)
            if is_leaf:
                leaves[name] = v
            copies.append(is_leaf and name in pm.clone_inputs)
            values.append(v)
        policy = self.policies.get(p, "none")

        def run(*xs: Any) -> Any:
            # in-place consumers of a received leaf get a copy (made inside the checkpointed
            # function, so that its saved inputs are never modified)
            return pm.module(*[_copy_tree(x) if c else x for x, c in zip(xs, copies)])

        if policy == "checkpoint":
            outs = checkpoint(run, *values, use_reentrant=False,
                              context_fn=lambda: (nullcontext(), frozen_running_stats(pm.module)))
        elif policy == "offload-activations":
            with self.act_off.saving(p, mb):
                outs = run(*values)
        elif policy == "offload-params":
            with self.param_off.resident(self.piece_params.get(p, [])):
                outs = run(*values)
        else:
            outs = run(*values)
        self.fwd_inputs[(p, mb)] = leaves
        produced = dict(zip(pm.outputs, outs))
        self.fwd_outputs[(p, mb)] = produced
        for name, value in produced.items():
            if name in pm.model_outputs:
                chunk = copy_of(name) * self.s.microbatches + mb
                target = self.targets[chunk] if self.targets is not None else None
                loss = self.loss_fn(value, target) / (self.s.microbatches * self.copies)
                self.losses[chunk] = loss.detach()
                produced[name] = loss
            else:
                self.local[(name, mb)] = value

    def backward(self, p: int, mb: int) -> None:
        pm = self.modules[p]
        self._random_context(p, mb)  # a checkpointed piece recomputes the same masks
        produced = self.fwd_outputs.pop((p, mb))
        roots: list[torch.Tensor] = []
        grads: list[torch.Tensor | None] = []
        for name, value in produced.items():
            if name in pm.model_outputs:
                if value.requires_grad:
                    roots.append(value)
                    grads.append(None)
                continue
            self.local.pop((name, mb), None)
            acc = self.grad_acc.pop((name, mb), None)
            if acc is None:
                continue
            for t, g in zip(tensors_of(value), acc):
                if g is not None and t.requires_grad:
                    roots.append(t)
                    grads.append(g)
        if roots:
            with self.param_off.resident(self.piece_params.get(p, []) if
                                         self.policies.get(p) == "offload-params" else []):
                torch.autograd.backward(roots, grads)
        self.act_off.release(p, mb)
        for name, leaf_value in self.fwd_inputs.pop((p, mb)).items():
            tensors = tensors_of(leaf_value)
            gs = [t.grad if t.requires_grad else None for t in tensors]
            tid = self.transfer_into.get((name, p))
            if tid is None:
                continue
            if self.s.pieces.transfers[tid].local:
                self._accumulate((name, mb), gs)
            else:
                self.send_grads.setdefault((tid, mb), {})[name] = gs

    def _accumulate(self, key: tuple[str, int], gs: list[torch.Tensor | None]) -> None:
        acc = self.grad_acc.get(key)
        if acc is None:
            self.grad_acc[key] = list(gs)
            return
        for i, g in enumerate(gs):
            if g is None:
                continue
            acc[i] = g if acc[i] is None else acc[i] + g

    # ------------------------------------------------------------------ communication
    def _grad_positions(self, name: str) -> list[int]:
        return [i for i, m in enumerate(self.metas[fx_name(name)].tensor_leaves())
                if m.differentiable]

    def send_activations(self, t: int, mb: int) -> None:
        tensors = []
        for name in self.transfer_names[t]:
            tensors += tensors_of(self.local[(name, mb)])
        self.msg.send((t, "F", mb), self.s.rank_of_transfer_dst(t), tensors)

    def recv_activations(self, t: int, mb: int) -> None:
        tensors = self.msg.recv((t, "F", mb), self.s.rank_of_transfer_src(t))
        it = iter(tensors)
        for name in self.transfer_names[t]:
            meta = self.metas[fx_name(name)]
            leaves = []
            for m in meta.tensor_leaves():
                x = next(it)
                if m.differentiable:
                    x.requires_grad_(True)
                leaves.append(x)
            self.received[(t, name, mb)] = meta.rebuild(leaves)

    def send_gradients(self, t: int, mb: int) -> None:
        grads = self.send_grads.pop((t, mb), {})
        tensors = []
        for name in self.transfer_names[t]:
            gs = grads.get(name)
            leaves = self.metas[fx_name(name)].tensor_leaves()
            for i in self._grad_positions(name):
                g = gs[i] if gs is not None else None
                tensors.append(g if g is not None else
                               torch.zeros(leaves[i].shape, dtype=leaves[i].dtype,
                                           device=self.device))
            self.received.pop((t, name, mb), None)
        self.msg.send((t, "B", mb), self.s.rank_of_transfer_src(t), tensors)

    def recv_gradients(self, t: int, mb: int) -> None:
        tensors = self.msg.recv((t, "B", mb), self.s.rank_of_transfer_dst(t))
        it = iter(tensors)
        for name in self.transfer_names[t]:
            n_leaves = len(self.metas[fx_name(name)].tensor_leaves())
            gs: list[torch.Tensor | None] = [None] * n_leaves
            for i in self._grad_positions(name):
                gs[i] = next(it)
            self._accumulate((name, mb), gs)

    def allreduce(self, bucket: int) -> None:
        """Start summing a bucket's gradients over the ranks that hold its parameters."""
        group, params = self.bucket_groups[bucket]
        if not params:
            return
        grads = [local(p.grad) if p.grad is not None else torch.zeros_like(local(p))
                 for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        work = dist.all_reduce(flat, group=group, async_op=True)
        self.pending_ar.append((work, flat, params, bucket))

    def finish_allreduces(self) -> None:
        """Wait for the started all-reduces and write the summed gradients back."""
        for work, flat, params, bucket in self.pending_ar:
            self.msg._wait(work, f"all-reducing the gradients of bucket {bucket}")
            offset = 0
            for p in params:
                shard = local(p)
                n = shard.numel()
                p.grad = like(p, flat[offset:offset + n].view_as(shard).clone())
                offset += n
        self.pending_ar.clear()


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of a tensor-parallel parameter or gradient (a DTensor), else
    ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def like(p: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """``shard`` as a gradient of ``p``: a DTensor on ``p``'s mesh when ``p`` is one."""
    if not hasattr(p, "to_local"):
        return shard
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(shard, p.device_mesh, p.placements, run_check=False)


def _copy_tree(value: Any) -> Any:
    """``value`` with every tensor cloned (autograd-tracked)."""
    from torch.utils._pytree import tree_map
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)


def _detach_tree(value: Any, meta: ValueMeta) -> Any:
    """A copy of ``value`` whose differentiable tensors are fresh autograd leaves."""
    tensors = tensors_of(value)
    leaves = []
    for t, m in zip(tensors, meta.tensor_leaves()):
        x = t.detach()
        if m.differentiable and t.requires_grad:
            x.requires_grad_(True)
        leaves.append(x)
    return meta.rebuild(leaves)
