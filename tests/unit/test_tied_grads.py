"""``zero/grads/staging.py``: which parameters count as tied (owned by two modules), and that the wait before a
large tied parameter's second gradient runs before each owner's backward, at stages 2-3 with overlap only, and
not for a copy of the model. No processes: the bucket group is a stand-in that records the waits."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
from torch import nn

from zerobench.zero.grads.staging import held_back, tied_owners, wait_before_tied_grads
from zerobench.zero.layout import ParamSlot, ParamSpec, build_layout


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 64, hidden: int = 8):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.body = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.body(self.wte(tokens)))).logsumexp(-1).mean()


def _setup(bucket_numel: int, keep_full: bool = False, max_inflight: int = 2):
    model = TiedLM()
    named = dict(model.named_parameters())  # the tied weight once, as the engine trains it
    layout = build_layout([ParamSpec(n, tuple(p.shape)) for n, p in named.items()], 2, bucket_numel, 8)
    slots: dict[str, ParamSlot] = {s.name: s for s in layout.params}
    zparams = [SimpleNamespace(param=p, slot=slots[n]) for n, p in named.items()]
    events: list[str] = []
    grads = SimpleNamespace(
        keep_full=keep_full,
        max_inflight=max_inflight,
        layout=layout,
        staging=SimpleNamespace(large=held_back(layout)),
        wait_inflight=lambda: events.append("wait"),
    )
    model.wte.weight.register_post_accumulate_grad_hook(lambda p: events.append("landed"))
    return model, zparams, grads, events


def test_a_parameter_two_modules_own_is_tied():
    model, zparams, _, _ = _setup(512)
    owners = tied_owners(model, zparams)
    assert list(owners) == [0] and zparams[0].param is model.wte.weight
    assert owners[0] == [model.wte, model.head]


def test_each_owners_backward_waits_first_at_stages_2_3_with_overlap():
    model, zparams, grads, events = _setup(512)  # the embedding (512 elements) is a large bucket of its own
    handles = wait_before_tied_grads(model, zparams, grads)
    assert len(handles) == 2
    model(torch.randint(0, 64, (2, 5))).backward()
    assert events == ["wait", "wait", "landed"], "the head's backward, then the lookup's, then its gradient is whole"
    events.clear()
    copy.deepcopy(model)(torch.randint(0, 64, (2, 5))).backward()
    assert events == [], "a copy of the model shares the hook function, not the engine"
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 5)))
    for h in handles:
        h.remove()
    model(torch.randint(0, 64, (2, 5))).backward()
    assert events == ["landed"]


def test_no_wait_without_staging_or_overlap():
    for kw in ({"keep_full": True}, {"max_inflight": 0}):  # stages 0-1; overlap_comm off: nothing in flight
        model, zparams, grads, _ = _setup(512, **kw)
        assert wait_before_tied_grads(model, zparams, grads) == []
