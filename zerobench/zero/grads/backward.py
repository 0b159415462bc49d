"""Backward passes: each one micro-batch, started by ``engine.backward(loss)`` or by a plain ``loss.backward()``.

DeepSpeed's training loops call ``engine.backward(loss)``; DDP's and FSDP's call ``loss.backward()`` and let
the wrapper's hooks do the rest. Both drive the engine:

- ``engine.backward(loss)`` (``run``) opens the pass (the micro-batch is counted and the bucket group told
  whether it synchronises), scales the loss (1 / ``grad_accum_steps``, and fp16's loss scale), runs
  autograd and closes the pass (the bucket group's ``finish``: the remaining buckets started, all waited for).
- A plain ``loss.backward()`` is opened by its first hook: a hook on the gradient of the root module's forward output,
  so it runs in the outermost autograd graph task, before any parameter gradient lands (a re-entrant checkpoint's
  inner backward is a nested task; its end is not the pass's end), or, for a backward that does not reach the root's
  output (a submodule called on its own), the first parameter gradient that lands. The close is queued on autograd's
  engine (``queue_callback``), which runs it when that backward ends. Each rank's gradient is autograd's, multiplied
  before its collective by 1/N, so the reduced one is the mean over ranks (DDP's), and by 1 / ``grad_accum_steps``
  (DeepSpeed's plain backward; 1 under DDP's loop, which accumulates with ``no_sync()``), so it equals
  ``engine.backward``'s. A backward from ``engine.scale(loss)`` (DeepSpeed's) carries that scaling already and
  counts as ``engine.backward``'s kind. Under fp16 a plain backward of the bare loss is refused: stepping on
  gradients without the loss scale would be silently wrong.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from zerobench.zero.grads.buckets import GradBucketGroup
from zerobench.zero.grads.staging import wait_before_tied_grads
from zerobench.zero.interop.containers import tensors_in
from zerobench.zero.interop.tooling import eager
from zerobench.zero.param import ZeroParam

FP16_PLAIN_BACKWARD = (
    "fp16 training needs the dynamic loss scale on the loss: call engine.backward(loss), or "
    "engine.scale(loss).backward() as DeepSpeed's; a plain loss.backward() would step on unscaled gradients"
)


class PassState(enum.Enum):
    """IDLE -> EXPLICIT (``engine.backward``) or PLAIN (``loss.backward()``, closed by autograd's callback) -> IDLE."""

    IDLE = "idle"
    EXPLICIT = "explicit"
    PLAIN = "plain"


class BackwardPasses:
    """Opens and closes the engine's backward passes; see the module docstring."""

    def __init__(
        self,
        root: nn.Module,
        zparams: list[ZeroParam],
        begin: Callable[[bool], None],
        end: Callable[[], None],
        scaled: bool,
    ):
        """``zparams``: the trained parameters. ``begin(plain)``/``end()``: the engine's start and finish of a
        micro-batch. ``scaled``: the loss needs a scale only ``engine.backward`` applies (fp16), so plain backward
        passes are refused."""
        self.state = PassState.IDLE
        self._scaled_task: int | None = None
        """The autograd graph task whose root is a loss ``mark_scaled`` saw (``engine.scale(loss)``)."""
        self._zparams, self._params = zparams, [zp.param for zp in zparams]
        self._begin, self._end, self._scaled = begin, end, scaled
        root_ref = weakref.ref(root)

        def on_output(module, args, output) -> None:  # a function: copy.deepcopy(model) shares it, not the engine
            if module is root_ref():  # (a copy's forward is not this engine's)
                self._on_root_output(output)

        self.handle = root.register_forward_hook(eager(on_output))

    def run(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        """``engine.backward``: open, ``loss.backward()``, close (``loss`` already scaled by the caller)."""
        self._drop_unfinished()
        if self.state is not PassState.IDLE:
            raise RuntimeError(
                f"engine.backward() inside another backward pass ({self.state.value}): call it once "
                f"per micro-batch, outside autograd"
            )
        self._begin(False)
        self.state = PassState.EXPLICIT
        try:
            loss.backward(retain_graph=retain_graph)
        finally:
            self.state = PassState.IDLE
        self._end()

    def install_hooks(self, model: nn.Module, grads: GradBucketGroup) -> list[RemovableHandle]:
        """The engine's backward hooks: one post-accumulate-grad hook per trained parameter (``grad_hook``), and the
        wait before a large tied parameter's second gradient (``zero/grads/staging.py``)."""
        return [
            zp.param.register_post_accumulate_grad_hook(self.grad_hook(zp, grads)) for zp in self._zparams
        ] + wait_before_tied_grads(model, self._zparams, grads)

    def grad_hook(self, zp: ZeroParam, grads: GradBucketGroup) -> Callable[[torch.Tensor], None]:
        """The post-accumulate-grad hook of one trained parameter: opens a plain pass if none is open (a backward
        that did not go through the root's output), then hands the gradient to the bucket group."""
        idle = PassState.IDLE
        if grads.keep_full:  # stages 0-1: .grad is a view of the bucket; the hook only counts

            def landed(p: torch.Tensor) -> None:
                if self.state is idle:
                    self.ensure_open()
                grads.grad_landed(zp, p)

            return landed

        def staged(p: torch.Tensor) -> None:  # stages 2-3: into the staging bucket, then freed
            if self.state is idle:
                self.ensure_open()
            grads.add_grad(zp, p.grad)
            p.grad = None

        return staged

    def is_open(self) -> bool:
        """Whether a backward pass (a micro-batch) is open now."""
        return self.state is not PassState.IDLE

    def ensure_open(self) -> None:
        """From any of the engine's backward hooks: open a plain ``loss.backward()`` if nothing has yet."""
        if self.state is PassState.IDLE:
            self._open_plain()

    def mark_scaled(self, loss: torch.Tensor) -> None:
        """``loss`` carries ``engine.backward``'s scaling (``engine.scale``): a plain backward from it is a pass of that
        kind (not scaled again; allowed under fp16). Its gradient hook fires first there (it is the root) and records
        the graph task."""
        if loss.requires_grad:
            loss.register_hook(self._note_scaled_task)

    def _note_scaled_task(self, grad: torch.Tensor) -> None:
        self._scaled_task = torch._C._current_graph_task_id()

    def _open_plain(self) -> None:
        from_scale = self._scaled_task == torch._C._current_graph_task_id()  # carries engine.backward's scaling
        if self._scaled and not from_scale:
            raise RuntimeError(FP16_PLAIN_BACKWARD)
        self._begin(not from_scale)
        self.state = PassState.PLAIN
        torch.autograd.Variable._execution_engine.queue_callback(self._close_plain)

    def _close_plain(self) -> None:
        self.state = PassState.IDLE
        self._end()

    def _drop_unfinished(self) -> None:
        """Outside autograd, a plain pass still open is one whose backward raised before its end (its callback
        never ran): forget it, or every later pass would be taken as part of it and never reduced."""
        if self.state is PassState.PLAIN and torch._C._current_graph_task_id() == -1:
            self.state = PassState.IDLE

    def _on_root_output(self, output) -> None:
        if torch._C._current_graph_task_id() != -1:  # a recompute inside backward
            return
        self._drop_unfinished()
        if not torch.is_grad_enabled():
            return
        for t in tensors_in(output):
            if t.requires_grad and t.grad_fn is not None:
                t.register_hook(self._on_output_grad)

    def _on_output_grad(self, grad: torch.Tensor) -> None:
        if self.state is PassState.IDLE and self._accumulates():
            self._open_plain()

    def _accumulates(self) -> bool:
        """Whether the running backward accumulates into some trained parameter's ``.grad`` (``loss.backward()``),
        not only reads the graph (``torch.autograd.grad(out, x)``: a gradient penalty, saliency). Such a backward is
        no micro-batch: it must not count towards a window nor reduce gradients, and at stage 3 closing a pass would
        free the units a ``create_graph`` backward still needs."""
        for p in self._params:
            if not p.requires_grad:  # frozen since apply_zero: no node (the step refuses it in one line)
                continue
            with torch.enable_grad():
                acc = p.view_as(p).grad_fn.next_functions[0][0]  # the parameter's AccumulateGrad node
            try:
                if torch._C._will_engine_execute_node(acc):
                    return True
            except RuntimeError as e:  # torch.autograd.grad(out, params): it refuses a leaf node, and never
                if "autograd.grad()" not in str(e):  # accumulates into .grad either
                    raise
                return False
        return False
