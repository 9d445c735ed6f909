"""How ``opguard diff`` scales: wall time and peak memory on synthetic GPT-2-like traces of 1M and
10M ops per side.

The traces are genuine: written through tests/traces.py's builder (the real writer and
:func:`~opguard.store.meta.write_meta`), with records shaped like the recorder's. One training
step of a 12-layer GPT-2 (batch 8 x 1024, AdamW) is modelled as a template of ~2.3k ops (forward,
backward with forward call sites, per-parameter optimizer ops, one ``.item()``), with realistic op
names, call sites with source lines, interned user stacks, 1-3 tensor inputs carrying producers,
one output, 64-bit fingerprints, raw heads and stats, RNG fingerprints on dropout, non-tensor
arguments. Run B differs from run A by

* an inserted logging op (``aten::linalg_vector_norm`` from a forward hook) after every
  ``--insert-every`` ops of A, whose output nothing reads, and
* one planted divergence near the end: the last block's ``gelu`` of the last step is called with
  ``approximate='none'`` instead of ``'tanh'``; everything downstream of it differs.

The diff must call that gelu the first divergence (kind ``argument``), align every op of A and
leave exactly the inserted ops unaligned in B. Each diff runs as a user runs it, a subprocess
``python -m opguard diff A B --json``; its wall time and its own peak RSS (``ru_maxrss`` from
``os.wait4``, the child's resource usage) are measured.

    python bench/diff_scale.py [--sizes 1e6,1e7] [--dir DIR] [--repeat N] [--json FILE]

Traces are cached in ``--dir`` (``DIR/ops-N/{a,b}``) and reused when present and built by this
version of the builder; without ``--dir`` they go to a temporary directory removed at the end.
10M ops per side take ~3.5 GB of disk per side and several minutes to build.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from opguard.store import schema

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the trace builder
from traces import TraceBuilder

BUILDER_VERSION = 2
INSERT_EVERY = 100_000
MASK = (1 << 64) - 1

FORWARD, BACKWARD, OPTIMIZER, OTHER = range(4)
DEVICE = "cuda:0"
ITEMSIZE = {"float32": 4, "int64": 8}

# -- the user's code the call sites point into ---------------------------------------------------

MODEL = "/home/user/nanogpt/model.py"
TRAIN = "/home/user/nanogpt/train.py"
HOOKS = "/home/user/nanogpt/debug_hooks.py"

SOURCES: dict[str, list[str]] = {
    MODEL: """\
import math
import torch
import torch.nn as nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):
    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):
    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def forward(self, idx, targets=None):
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss
""".splitlines(),
    TRAIN: """\
import torch
from model import GPT, GPTConfig


def main():
    model = GPT(GPTConfig()).cuda()
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
    for step in range(max_iters):
        X, Y = get_batch("train")
        logits, loss = model(X, Y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lossf = loss.item()


if __name__ == "__main__":
    main()
""".splitlines(),
    HOOKS: """\
import torch

norms = []


def log_activation(module, inputs, output):
    norms.append(output.detach().norm())
""".splitlines(),
}


def _line(path: str, text: str) -> int:
    return next(n for n, line in enumerate(SOURCES[path], 1) if text in line)


# (file, function, text of the call line): the innermost user frame of each op.
SITES: dict[str, tuple[str, str, str]] = {
    "tok_emb": (MODEL, "forward", "tok_emb = "),
    "pos_emb": (MODEL, "forward", "pos_emb = "),
    "drop": (MODEL, "forward", "x = self.transformer.drop"),
    "ln_1": (MODEL, "forward", "self.attn(self.ln_1(x))"),
    "ln_2": (MODEL, "forward", "self.mlp(self.ln_2(x))"),
    "c_attn": (MODEL, "forward", "self.c_attn(x).split"),
    "k": (MODEL, "forward", "k = k.view"),
    "q": (MODEL, "forward", "q = q.view"),
    "v": (MODEL, "forward", "v = v.view"),
    "sdpa": (MODEL, "forward", "scaled_dot_product_attention"),
    "merge": (MODEL, "forward", "y = y.transpose(1, 2)"),
    "attn_proj": (MODEL, "forward", "self.resid_dropout(self.c_proj(y))"),
    "c_fc": (MODEL, "forward", "x = self.c_fc(x)"),
    "gelu": (MODEL, "forward", "x = self.gelu(x)"),
    "mlp_proj": (MODEL, "forward", "x = self.c_proj(x)"),
    "mlp_drop": (MODEL, "forward", "x = self.dropout(x)"),
    "ln_f": (MODEL, "forward", "self.transformer.ln_f(x)"),
    "lm_head": (MODEL, "forward", "self.lm_head(x)"),
    "loss": (MODEL, "forward", "loss = F.cross_entropy"),
    "model": (TRAIN, "main", "logits, loss = model(X, Y)"),
    "backward": (TRAIN, "main", "loss.backward()"),
    "optimizer": (TRAIN, "main", "optimizer.step()"),
    "item": (TRAIN, "main", "lossf = loss.item()"),
    "main": (TRAIN, "<module>", "    main()"),
    "block": (MODEL, "forward", "x = block(x)"),
    "attn": (MODEL, "forward", "self.attn(self.ln_1(x))"),
    "mlp": (MODEL, "forward", "self.mlp(self.ln_2(x))"),
    "hook": (HOOKS, "log_activation", "norms.append"),
}

# The user stack above each site (outermost first, the site itself last).
_ATTN = ("main", "model", "block", "attn")
_MLP = ("main", "model", "block", "mlp")
STACKS: dict[str, tuple[str, ...]] = {
    **{s: ("main", "model", s) for s in ("tok_emb", "pos_emb", "drop", "ln_f", "lm_head", "loss")},
    **{s: ("main", "model", "block", s) for s in ("ln_1", "ln_2", "attn", "mlp")},
    **{s: (*_ATTN, s) for s in ("c_attn", "k", "q", "v", "sdpa", "merge", "attn_proj")},
    **{s: (*_MLP, s) for s in ("c_fc", "gelu", "mlp_proj", "mlp_drop")},
    **{s: ("main", s) for s in ("backward", "optimizer", "item")},
    "hook": ("main", "model", "block", "hook"),
}


def site_of(name: str) -> tuple[str, int, str, list[list[Any]]]:
    """What the recorder interns for a call site: file, line, function and the source lines
    around it."""
    path, function, text = SITES[name]
    line = _line(path, text)
    lines = SOURCES[path]
    source = [[n, lines[n - 1]] for n in range(max(1, line - 3), min(len(lines), line + 3) + 1)]
    return path, line, function, source


# -- one training step as a template of ops ------------------------------------------------------

# An input's source: ("op", template position in this step), ("prev", position in the previous
# step: a parameter or optimizer state its last in-place update wrote; a leaf in step 0), or
# ("data", name): a new leaf every step (the batch).
Ref = tuple[str, Any]


@dataclass
class TemplateOp:
    name: str
    site: str
    phase: int
    inputs: list[tuple[str, Ref, str, tuple[int, ...]]]  # slot, source, dtype, shape
    dtype: str
    shape: tuple[int, ...]
    view: bool = False
    written: bool = False
    args: list[list[Any]] | None = None
    forward: int | None = None  # template position of the forward op (backward ops)
    random: bool = False
    item: bool = False  # returns a Python scalar (``.item()``): no output tensor


@dataclass
class Template:
    """One training step. ``tensors`` maps a name (parameter, optimizer state, gradient) to its
    latest writer in the step being built."""

    ops: list[TemplateOp] = field(default_factory=list)
    shapes: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    tensors: dict[str, int] = field(default_factory=dict)

    def ref(self, source: int | str) -> tuple[Ref, str, tuple[int, ...]]:
        if isinstance(source, int):
            op = self.ops[source]
            return ("op", source), op.dtype, op.shape
        dtype, shape = self.shapes[source]
        if source.startswith("data:"):
            return ("data", source), dtype, shape
        if source in self.tensors:
            return ("op", self.tensors[source]), dtype, shape
        return ("prev", source), dtype, shape

    def add(
        self,
        name: str,
        site: str,
        inputs: list[int | str],
        shape: tuple[int, ...] | None,
        *,
        phase: int = FORWARD,
        dtype: str = "float32",
        view: bool = False,
        writes: str | None = None,
        args: list[list[Any]] | None = None,
        forward: int | None = None,
        random: bool = False,
        item: bool = False,
    ) -> int:
        slots = ["self", "other", "tensor2"][: len(inputs)]
        if name == "aten::addmm.default":
            slots = ["self", "mat1", "mat2"]
        elif name == "aten::native_layer_norm.default":
            slots = ["input", "weight", "bias"]
        elif name.startswith("aten::embedding."):
            slots = ["weight", "indices"]
        elif name.startswith("aten::_scaled_dot_product"):
            slots = ["query", "key", "value"]
        elif len(inputs) == 3:
            slots = ["self", "tensor1", "tensor2"]
        entries = []
        for slot, source in zip(slots, inputs, strict=True):
            ref, in_dtype, in_shape = self.ref(source)
            entries.append((slot, ref, in_dtype, in_shape))
        if writes is not None:
            dtype, shape = self.shapes[writes]
        assert shape is not None
        self.ops.append(
            TemplateOp(
                name,
                site,
                phase,
                entries,
                dtype,
                shape,
                view,
                writes is not None,
                args,
                forward,
                random,
                item,
            )
        )
        pos = len(self.ops) - 1
        if writes is not None:
            self.tensors[writes] = pos
        return pos

    def grad(self, param: str, pos: int, site: str, forward: int) -> None:
        """Makes op ``pos`` the gradient of ``param``, accumulated when one exists already."""
        key = f"grad:{param}"
        if key in self.tensors:
            self.add(
                "aten::add_.Tensor",
                site,
                [key, pos],
                None,
                phase=BACKWARD,
                writes=key,
                forward=forward,
            )
        else:
            self.shapes[key] = self.shapes[param]
            self.tensors[key] = pos


def gpt2_template(
    layers: int = 12, batch: int = 8, seq: int = 1024, width: int = 768, vocab: int = 50257
) -> Template:
    """One step of GPT-2 124M training with AdamW: ~2.3k ops."""
    t = Template()
    heads, bt = 12, batch * seq
    params: list[str] = []

    def param(name: str, *shape: int) -> str:
        t.shapes[name] = ("float32", shape)
        params.append(name)
        return name

    wte, wpe = param("wte", vocab, width), param("wpe", seq, width)
    blocks = []
    for i in range(layers):
        p = f"h.{i}."
        blocks.append(
            {
                k: param(p + k, *s)
                for k, s in (
                    ("ln_1.weight", (width,)),
                    ("ln_1.bias", (width,)),
                    ("attn.c_attn.weight", (3 * width, width)),
                    ("attn.c_attn.bias", (3 * width,)),
                    ("attn.c_proj.weight", (width, width)),
                    ("attn.c_proj.bias", (width,)),
                    ("ln_2.weight", (width,)),
                    ("ln_2.bias", (width,)),
                    ("mlp.c_fc.weight", (4 * width, width)),
                    ("mlp.c_fc.bias", (4 * width,)),
                    ("mlp.c_proj.weight", (width, 4 * width)),
                    ("mlp.c_proj.bias", (width,)),
                )
            }
        )
    ln_f_w, ln_f_b = param("ln_f.weight", width), param("ln_f.bias", width)
    t.shapes["data:idx"] = ("int64", (batch, seq))
    t.shapes["data:pos"] = ("int64", (seq,))
    t.shapes["data:targets"] = ("int64", (batch, seq))
    for name in params:
        t.shapes[f"exp_avg:{name}"] = t.shapes[name]
        t.shapes[f"exp_avg_sq:{name}"] = t.shapes[name]

    add = t.add
    x3, x2 = (batch, seq, width), (bt, width)

    def view(src: int, shape: tuple[int, ...], site: str, name: str = "aten::view.default") -> int:
        return add(name, site, [src], shape, view=True, args=[["size", list(shape)]])

    def linear(src: int, w: str, b: str, out: int, site: str) -> int:
        flat = view(src, (bt, t.shapes[w][1][1]), site)
        wt = add("aten::t.default", site, [w], t.shapes[w][1][::-1], view=True)
        y = add("aten::addmm.default", site, [b, flat, wt], (bt, out))
        return view(y, (batch, seq, out), site)

    def layer_norm(src: int, w: str, b: str, site: str) -> int:
        return add(
            "aten::native_layer_norm.default",
            site,
            [src, w, b],
            x3,
            args=[["normalized_shape", [width]], ["eps", 1e-05]],
        )

    def dropout(src: int, site: str) -> int:
        return add(
            "aten::native_dropout.default",
            site,
            [src],
            t.ops[src].shape,
            random=True,
            args=[["p", 0.1], ["train", True]],
        )

    # forward
    tok = add("aten::embedding.default", "tok_emb", [wte, "data:idx"], x3)
    pos = add("aten::embedding.default", "pos_emb", [wpe, "data:pos"], (seq, width))
    x = dropout(add("aten::add.Tensor", "drop", [tok, pos], x3), "drop")
    gelus = []
    for blk in blocks:
        ln1 = layer_norm(x, blk["ln_1.weight"], blk["ln_1.bias"], "ln_1")
        qkv = linear(ln1, blk["attn.c_attn.weight"], blk["attn.c_attn.bias"], 3 * width, "c_attn")
        parts = []
        for k, site in enumerate(("q", "k", "v")):
            part = add(
                "aten::slice.Tensor",
                "c_attn",
                [qkv],
                x3,
                view=True,
                args=[["dim", 2], ["start", k * width], ["end", (k + 1) * width]],
            )
            split = view(part, (batch, seq, heads, width // heads), site)
            parts.append(
                add(
                    "aten::transpose.int",
                    site,
                    [split],
                    (batch, heads, seq, width // heads),
                    view=True,
                    args=[["dim0", 1], ["dim1", 2]],
                )
            )
        att = add(
            "aten::_scaled_dot_product_flash_attention_for_cpu.default",
            "sdpa",
            parts,
            (batch, heads, seq, width // heads),
            args=[["is_causal", True]],
        )
        back = add(
            "aten::transpose.int",
            "merge",
            [att],
            (batch, seq, heads, width // heads),
            view=True,
            args=[["dim0", 1], ["dim1", 2]],
        )
        merged = view(
            add(
                "aten::clone.default",
                "merge",
                [back],
                (batch, seq, heads, width // heads),
                args=[["memory_format", "torch.contiguous_format"]],
            ),
            x3,
            "merge",
        )
        proj = linear(
            merged, blk["attn.c_proj.weight"], blk["attn.c_proj.bias"], width, "attn_proj"
        )
        x = add("aten::add.Tensor", "attn", [x, dropout(proj, "attn_proj")], x3)
        ln2 = layer_norm(x, blk["ln_2.weight"], blk["ln_2.bias"], "ln_2")
        fc = linear(ln2, blk["mlp.c_fc.weight"], blk["mlp.c_fc.bias"], 4 * width, "c_fc")
        gelu = add(
            "aten::gelu.default",
            "gelu",
            [fc],
            (batch, seq, 4 * width),
            args=[["approximate", "tanh"]],
        )
        gelus.append(gelu)
        out = linear(gelu, blk["mlp.c_proj.weight"], blk["mlp.c_proj.bias"], width, "mlp_proj")
        x = add("aten::add.Tensor", "mlp", [x, dropout(out, "mlp_drop")], x3)
    h = view(layer_norm(x, ln_f_w, ln_f_b, "ln_f"), x2, "lm_head")
    logits = add(
        "aten::mm.default",
        "lm_head",
        [h, add("aten::t.default", "lm_head", [wte], (width, vocab), view=True)],
        (bt, vocab),
    )
    flat = view(view(logits, (batch, seq, vocab), "lm_head"), (bt, vocab), "loss")
    logp = add(
        "aten::_log_softmax.default",
        "loss",
        [flat],
        (bt, vocab),
        args=[["dim", 1], ["half_to_float", False]],
    )
    targets = add(
        "aten::view.default",
        "loss",
        ["data:targets"],
        (bt,),
        dtype="int64",
        view=True,
        args=[["size", [-1]]],
    )
    loss = add(
        "aten::nll_loss_forward.default",
        "loss",
        [logp, targets],
        (),
        args=[["reduction", 1], ["ignore_index", -1]],
    )
    n_forward = len(t.ops)

    # backward: the chain of gradients through the forward ops in reverse, each backward op at its
    # forward op's call site; parameter gradients accumulate into grad:NAME
    g = add(
        "aten::ones_like.default",
        "backward",
        [loss],
        (),
        phase=BACKWARD,
        args=[["memory_format", "torch.preserve_format"]],
    )
    residual: list[int] = []
    for f in range(n_forward - 1, -1, -1):
        op = t.ops[f]

        def bw(
            name: str,
            inputs: list[int | str],
            shape: tuple[int, ...],
            f: int = f,
            op: TemplateOp = op,
            **kw: Any,
        ) -> int:
            return add(name, op.site, inputs, shape, phase=BACKWARD, forward=f, **kw)

        activation = [r[1] for _, r, _, _ in op.inputs if r[0] == "op"]
        params_in = [r[1] for _, r, _, _ in op.inputs if r[0] == "prev"]
        if op.name == "aten::add.Tensor" and op.site in ("attn", "mlp"):
            residual.append(g)
        elif op.view:
            if activation and t.ops[activation[0]].dtype == "float32":
                shape = t.ops[activation[0]].shape
                if op.name == "aten::slice.Tensor":
                    g = bw(
                        "aten::slice_backward.default",
                        [g],
                        shape,
                        args=[["input_sizes", list(shape)], *op.args[:3]],
                    )  # type: ignore[index]
                else:
                    g = bw(op.name, [g], shape, view=True, args=op.args)
        elif op.name == "aten::addmm.default":
            b, w = params_in[0], t.ops[activation[1]].inputs[0][1][1]  # addmm(b, x, t(w))
            wt = bw("aten::t.default", [w], t.shapes[w][1], view=True)
            dx = bw("aten::mm.default", [g, wt], t.ops[activation[0]].shape)
            xt = bw("aten::t.default", [activation[0]], t.ops[activation[0]].shape[::-1], view=True)
            dw = bw("aten::mm.default", [xt, g], t.shapes[w][1][::-1])
            t.grad(w, bw("aten::t.default", [dw], t.shapes[w][1], view=True), op.site, f)
            db = bw(
                "aten::sum.dim_IntList",
                [g],
                (1, t.shapes[b][1][0]),
                args=[["dim", [0]], ["keepdim", True]],
            )
            t.grad(b, bw("aten::view.default", [db], t.shapes[b][1], view=True), op.site, f)
            g = dx
        elif op.name == "aten::mm.default":
            dx = bw("aten::mm.default", [g, wte], x2)
            gt = bw("aten::t.default", [g], (vocab, bt), view=True)
            t.grad(wte, bw("aten::mm.default", [gt, activation[0]], (vocab, width)), op.site, f)
            g = dx
        elif op.name == "aten::native_layer_norm.default":
            w, b = params_in
            dx = bw(
                "aten::native_layer_norm_backward.default",
                [g, activation[0], w],
                x3,
                args=[["normalized_shape", [width]], ["output_mask", [True, True, True]]],
            )
            gx = bw("aten::mul.Tensor", [g, activation[0]], x3)
            t.grad(
                w, bw("aten::sum.dim_IntList", [gx], (width,), args=[["dim", [0, 1]]]), op.site, f
            )
            t.grad(
                b, bw("aten::sum.dim_IntList", [g], (width,), args=[["dim", [0, 1]]]), op.site, f
            )
            g = dx
            if residual and op.site in ("ln_1", "ln_2"):
                g = bw("aten::add.Tensor", [g, residual.pop()], x3)
        elif op.name == "aten::native_dropout.default":
            g = bw(
                "aten::native_dropout_backward.default",
                [g, f],
                op.shape,
                args=[["scale", 1.1111111111111112]],
            )
        elif op.name == "aten::gelu.default":
            g = bw("aten::gelu_backward.default", [g, activation[0]], op.shape, args=op.args)
        elif op.name.startswith("aten::_scaled_dot_product"):
            q, k, v = activation
            dq = bw(
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
                [g, q, k],
                op.shape,
                args=[["is_causal", True]],
            )
            bw("aten::bmm.default", [g, v], op.shape)
            bw("aten::bmm.default", [g, q], op.shape)
            g = dq
        elif op.name == "aten::_log_softmax.default":
            g = bw(
                "aten::_log_softmax_backward_data.default",
                [g, f],
                op.shape,
                args=[["dim", 1], ["input_dtype", "torch.float32"]],
            )
        elif op.name == "aten::nll_loss_forward.default":
            g = bw(
                "aten::nll_loss_backward.default",
                [g, *activation],
                (bt, vocab),
                args=[["reduction", 1], ["ignore_index", -1]],
            )
        elif op.name == "aten::add.Tensor":  # token + position embeddings
            t.grad(
                wpe, bw("aten::sum.dim_IntList", [g], (seq, width), args=[["dim", [0]]]), op.site, f
            )
        elif op.name == "aten::embedding.default" and op.site == "tok_emb":
            t.grad(
                wte,
                bw(
                    "aten::embedding_dense_backward.default",
                    [g, "data:idx"],
                    (vocab, width),
                    args=[["num_weights", vocab]],
                ),
                op.site,
                f,
            )

    # AdamW, one parameter at a time (foreach=False), at the user's optimizer.step() line
    for name in params:
        p, m, v, gr = name, f"exp_avg:{name}", f"exp_avg_sq:{name}", f"grad:{name}"
        opt = {"phase": OPTIMIZER}
        add("aten::mul_.Scalar", "optimizer", [p], None, writes=p, args=[["other", 0.99994]], **opt)
        add(
            "aten::lerp_.Scalar",
            "optimizer",
            [m, gr],
            None,
            writes=m,
            args=[["weight", 0.1]],
            **opt,
        )
        add("aten::mul_.Scalar", "optimizer", [v], None, writes=v, args=[["other", 0.95]], **opt)
        add(
            "aten::addcmul_.default",
            "optimizer",
            [v, gr, gr],
            None,
            writes=v,
            args=[["value", 0.05]],
            **opt,
        )
        denom = add("aten::sqrt.default", "optimizer", [v], t.shapes[v][1], **opt)
        denom = add(
            "aten::div.Scalar",
            "optimizer",
            [denom],
            t.shapes[v][1],
            args=[["other", "BIAS2"]],
            **opt,
        )
        add(
            "aten::addcdiv_.default",
            "optimizer",
            [p, m, denom],
            None,
            writes=p,
            args=[["value", "STEP_SIZE"]],
            **opt,
        )
    add("aten::_local_scalar_dense.default", "item", [loss], (), phase=OTHER, item=True)
    t.gelus = gelus  # type: ignore[attr-defined]
    return t


# -- the plan: what run B changes ---------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Two runs of ``steps`` steps; B inserts a logging op after every ``insert_every`` ops of A
    and calls op ``diverge_at`` of A (a gelu) with another argument."""

    steps: int
    step_ops: int
    insert_every: int
    diverge_at: int  # index in A

    @property
    def ops_a(self) -> int:
        return self.steps * self.step_ops

    @property
    def inserted(self) -> int:
        return (self.ops_a - 1) // self.insert_every

    @property
    def ops_b(self) -> int:
        return self.ops_a + self.inserted

    def b_index(self, a_index: int) -> int:
        return a_index + a_index // self.insert_every

    def inserted_b(self) -> list[int]:
        """Indices in B of the inserted ops."""
        return [self.b_index(k * self.insert_every) - 1 for k in range(1, self.inserted + 1)]


def make_plan(ops: int, insert_every: int = INSERT_EVERY, template: Template | None = None) -> Plan:
    t = template or gpt2_template()
    steps = max(1, round(ops / len(t.ops)))
    last_gelu = t.gelus[-1]  # type: ignore[attr-defined]
    return Plan(steps, len(t.ops), insert_every, (steps - 1) * len(t.ops) + last_gelu)


def expected(plan: Plan) -> dict[str, Any]:
    """What ``opguard diff --json`` must report for this pair."""
    return {
        "verdict": "diverged",
        "kind": "argument",
        "op": "aten::gelu.default",
        "a_index": plan.diverge_at,
        "b_index": plan.b_index(plan.diverge_at),
        "argument": "approximate",
        "aligned": plan.ops_a,
        "unaligned_a": 0,
        "unaligned_b": plan.inserted,
        "unaligned_b_examples": plan.inserted_b()[:5],
    }


def check(result: dict[str, Any], plan: Plan) -> list[str]:
    """Differences between a diff's JSON and what the plan planted (empty: all found)."""
    want = expected(plan)
    first = result.get("first_divergence") or {}
    a, b = first.get("a") or {}, first.get("b") or {}
    ranks = result.get("ranks") or [{}]
    got = {
        "verdict": result.get("verdict"),
        "kind": first.get("kind"),
        "op": a.get("op"),
        "a_index": a.get("index"),
        "b_index": b.get("index"),
        "argument": (first.get("arguments_differ") or [{}])[0].get("name"),
        "aligned": result.get("aligned"),
        "unaligned_a": result.get("unaligned_a"),
        "unaligned_b": result.get("unaligned_b"),
        "unaligned_b_examples": ranks[0].get("unaligned_b_examples"),
    }
    return [f"{k}: expected {want[k]!r}, got {got[k]!r}" for k in want if got[k] != want[k]]


# -- generating and writing records -------------------------------------------------------------


def _mix(x: int) -> int:
    """splitmix64's finaliser: a stand-in fingerprint."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _content(h: int) -> tuple[bytes, list[Any]]:
    """Raw head (8 float32) and stats [min, max, mean, absmax, nan, inf] derived from a hash."""
    u = (h >> 11) * (1.0 / (1 << 53))
    return h.to_bytes(8, "little") * 4, [-u, u * 0.9, (u - 0.5) * 1e-3, u, 0, 0]


def records(template: Template, plan: Plan, side: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, record) of run ``side`` ("a" or "b") in execution order, with ids interned by the
    callbacks set in :func:`write_side` (``template.ids``)."""
    ids = template.ids  # type: ignore[attr-defined]
    n_ops = plan.step_ops
    b = side == "b"
    index_of = plan.b_index if b else (lambda a: a)
    tainted: set[int] = set()  # A indices whose outputs differ in B
    # static parts of each op: (name id, site id, stack id, inputs, output template, nbytes)
    static = []
    for op in template.ops:
        ins = [
            (
                slot,
                ref,
                {"n": slot, "d": d, "s": list(s), "v": DEVICE, "t": _strides(s)},
                _numel(s) * ITEMSIZE[d],
            )
            for slot, ref, d, s in op.inputs
        ]
        out = {"n": "0", "d": op.dtype, "s": list(op.shape), "v": DEVICE, "t": _strides(op.shape)}
        flags = (schema.FLAG_VIEW if op.view else 0) | (schema.FLAG_WRITTEN if op.written else 0)
        static.append(
            (
                ids["name"][op.name],
                *ids["site"][op.site],
                ins,
                out,
                flags,
                _numel(op.shape) * ITEMSIZE[op.dtype],
            )
        )
    leaf_salt = {name: zlib.crc32(name.encode()) for name in template.shapes}
    for step in range(plan.steps):
        base = step * n_ops
        step_size = -6e-4 / (1 - 0.9 ** (step + 1))
        bias2 = (1 - 0.95 ** (step + 1)) ** 0.5
        for pos, op in enumerate(template.ops):
            a_index = base + pos
            index = index_of(a_index)
            name_id, site_id, stack_id, ins, out, flags, nbytes = static[pos]
            taint = b and a_index == plan.diverge_at
            xs = []
            for _slot, (kind, target), entry, in_bytes in ins:
                if kind == "op":
                    at = target
                    producer = base + at
                elif kind == "prev" and step > 0:
                    at = template.tensors[target]
                    producer = base - n_ops + at
                else:  # a leaf: parameters and state before the first update, the batch
                    producer = None
                if producer is None:
                    h = _mix(leaf_salt[target] ^ ((step + 1) << 40 if kind == "data" else 0))
                    head, stats = _content(h)
                    xs.append({**entry, "h": h, "z": in_bytes, "b": head, "m": stats})
                    continue
                bad = producer in tainted
                taint = taint or bad
                h = _mix((producer << 1) | bad)
                head, stats = _content(h)
                x = {
                    **entry,
                    "h": h,
                    "z": in_bytes,
                    "b": head,
                    "m": stats,
                    "p": [index_of(producer), 0],
                }
                if template.ops[at].view:
                    x["f"] = schema.FLAG_VIEW
                xs.append(x)
            if taint:
                tainted.add(a_index)
            h = _mix((a_index << 1) | taint)
            record: dict[str, Any] = {"i": index, "o": name_id, "s": step, "x": xs}
            if op.item:
                record["y"] = []
            elif flags & schema.FLAG_VIEW:
                record["y"] = [{**out, "f": flags, "h": h, "z": nbytes}]
            else:
                head, stats = _content(h)
                y = {**out, "h": h, "z": nbytes, "b": head, "m": stats}
                if flags:
                    y["f"] = flags
                record["y"] = [y]
            record["p"] = op.phase
            if op.forward is not None:
                record["f"] = index_of(base + op.forward)
            record["c"], record["k"] = site_id, stack_id
            if op.args:
                args = op.args
                if a_index == plan.diverge_at and b:
                    args = [["approximate", "none"]]
                elif op.phase == OPTIMIZER and isinstance(args[0][1], str):
                    args = [[args[0][0], step_size if args[0][1] == "STEP_SIZE" else bias2]]
                record["a"] = args
            if op.random:
                record["r"] = _mix((step << 32) ^ pos ^ 0x5EED)
            if op.item:
                record["v"] = 10.0 + 0.001 * (h >> 54) - 0.001 * step
            yield index, record
            if b and (a_index + 1) % plan.insert_every == 0 and a_index + 1 < plan.ops_a:
                # the forward hook's logging op, reading this op's output; nothing reads its own
                logged = _mix((a_index << 1) | taint)
                if op.item:  # nothing to read: a leaf
                    x = {"n": "self", "d": "float32", "s": [], "v": DEVICE, "t": [], "h": logged}
                else:
                    x = {**out, "n": "self", "h": logged, "z": nbytes, "p": [index, 0]}
                yield (
                    index + 1,
                    {
                        "i": index + 1,
                        "o": ids["name"]["aten::linalg_vector_norm.default"],
                        "s": step,
                        "x": [x],
                        "y": [
                            {
                                "n": "0",
                                "d": "float32",
                                "s": [],
                                "v": DEVICE,
                                "t": [],
                                "h": _mix(logged ^ 0x10C),
                                "z": 4,
                                "b": b"\0" * 4,
                                "m": [1.0] * 4 + [0, 0],
                            }
                        ],
                        "p": OTHER,
                        "c": ids["site"]["hook"][0],
                        "k": ids["site"]["hook"][1],
                        "a": [["ord", 2]],
                    },
                )


def write_side(run_dir: Path, plan: Plan, side: str) -> int:
    """Writes run ``side`` of ``plan`` into ``run_dir`` with the real writer; returns its op count."""
    template = gpt2_template()
    started = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "schema": schema.SCHEMA_VERSION,
        "opguard": "synthetic",
        "command": ["python", "train.py"],
        "argv": ["train.py"],
        "cwd": "/home/user/nanogpt",
        "executable": sys.executable,
        "python": platform.python_version(),
        "torch": "synthetic (bench/diff_scale.py)",
        "cuda": None,
        "devices": [DEVICE],
        "host": "bench",
        "platform": platform.platform(),
        "env": {},
        "world_size": 1,
        "steps_limit": None,
        "started": started,
        "status": "running",
    }
    start = {"pid": os.getpid(), "started": started}
    run = TraceBuilder(run_dir, meta=meta, start=start, batch_size=16384)

    class Names(dict):  # interned on first use, in the order a recorder meets them
        def __missing__(self, key: str) -> int:
            value = self[key] = run.name(key)
            return value

    class Sites(dict):
        def __missing__(self, key: str) -> tuple[int, int]:
            frames = [run.site(*site_of(s)) for s in STACKS[key]]
            value = self[key] = (frames[-1], run.stack(frames))
            return value

    names, sites = Names(), Sites()
    for op in template.ops:
        names[op.name], sites[op.site]
    if side == "b":
        names["aten::linalg_vector_norm.default"], sites["hook"]
    template.ids = {"name": names, "site": sites}  # type: ignore[attr-defined]
    count = 0
    for _index, record in records(template, plan, side):
        run.append(record)
        count += 1
    end = {
        "status": "finished",
        "ops": count,
        "steps": plan.steps,
        "exit_code": 0,
        "error": None,
        "stopped": None,
    }
    run.close(end, meta={**end, "ended": time.time(), "recorder_failure": None})
    return count


def build_pair(
    root: Path, ops: int, *, insert_every: int = INSERT_EVERY, parallel: bool = True
) -> tuple[Plan, float, bool]:
    """Runs A and B of ~``ops`` ops each under ``root`` (``root/a``, ``root/b``), reusing a
    complete earlier build of the same plan. Returns the plan, build seconds, and whether
    the traces were reused."""
    plan = make_plan(ops, insert_every)
    stamp = root / "build.json"
    wanted = {"builder": BUILDER_VERSION, "plan": asdict(plan)}
    if stamp.exists():
        try:
            if json.loads(stamp.read_text()) == wanted:
                return plan, 0.0, True
        except ValueError:
            pass
        stamp.unlink()
    for side in ("a", "b"):
        if (root / side).exists():
            shutil.rmtree(root / side)
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if parallel:
        ctx = get_context("spawn")
        with ctx.Pool(2) as pool:
            pool.starmap(write_side, [(root / "a", plan, "a"), (root / "b", plan, "b")])
    else:
        write_side(root / "a", plan, "a")
        write_side(root / "b", plan, "b")
    elapsed = time.perf_counter() - started
    stamp.write_text(json.dumps(wanted))
    return plan, elapsed, False


# -- measuring the diff --------------------------------------------------------------------------


def warm(*runs: Path) -> None:
    """Reads the traces' files once, so the diff is timed on a warm page cache (as right after
    recording) rather than on the disk."""
    for run in runs:
        for path in run.glob("rank-*/data.mdb"):
            with path.open("rb", buffering=0) as f:
                while f.read(1 << 23):
                    pass


def run_diff(a: Path, b: Path) -> tuple[dict[str, Any], float, int, int]:
    """``python -m opguard diff A B --json`` as a user runs it: (JSON, wall seconds, peak RSS in
    bytes of that process alone, from its own resource usage, exit code)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "opguard", "diff", str(a.resolve()), str(b.resolve()), "--json"],
            cwd=tempfile.gettempdir(),  # a source checkout in the cwd would shadow the install
            stdout=out,
            stderr=err,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if code not in (0, 1):
            raise RuntimeError(f"opguard diff failed ({code}): {err.read().decode()}")
        return json.loads(out.read()), elapsed, usage.ru_maxrss * 1024, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e6,1e7", help="ops per side, comma-separated")
    parser.add_argument("--dir", type=Path, help="cache of built traces (default: a temp dir)")
    parser.add_argument("--insert-every", type=int, default=INSERT_EVERY)
    parser.add_argument(
        "--repeat", type=int, default=1, help="diff runs per size (fastest kept, highest RSS)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    temp = args.dir is None
    root = Path(tempfile.mkdtemp(prefix="opguard-diff-scale-")) if temp else args.dir
    rows = []
    failed = False
    try:
        for size in sizes:
            where = root / f"ops-{size}"
            print(f"building {size:,} ops per side in {where} ...", file=sys.stderr, flush=True)
            plan, build_s, reused = build_pair(where, size, insert_every=args.insert_every)
            warm(where / "a", where / "b")
            best: tuple[float, int] | None = None
            found = True
            for _ in range(args.repeat):
                result, diff_s, rss, code = run_diff(where / "a", where / "b")
                problems = check(result, plan) + ([] if code == 1 else [f"exit {code}, not 1"])
                if problems:
                    failed, found = True, False
                    print(
                        f"{size:,}: the diff missed what was planted:",
                        *problems,
                        sep="\n  ",
                        file=sys.stderr,
                    )
                best = (diff_s, rss) if best is None else (min(best[0], diff_s), max(best[1], rss))
            assert best is not None
            rows.append(
                {
                    "ops_per_side": plan.ops_a,
                    "ops_b": plan.ops_b,
                    "steps": plan.steps,
                    "inserted": plan.inserted,
                    "build_s": None if reused else round(build_s, 1),
                    "diff_s": round(best[0], 2),
                    "ops_per_s": round(plan.ops_a / best[0]),
                    "peak_rss_mib": round(best[1] / 2**20, 1),
                    "found": found,
                }
            )
    finally:
        if temp:
            shutil.rmtree(root, ignore_errors=True)
    machine = {
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    print(" ".join(f"{k}: {v}" for k, v in machine.items()))
    print(
        f"{'ops/side':>12} {'steps':>6} {'build s':>9} {'diff s':>8} {'ops/s/side':>11} "
        f"{'peak RSS':>10}  verdict"
    )
    for r in rows:
        build = "cached" if r["build_s"] is None else f"{r['build_s']:.1f}"
        print(
            f"{r['ops_per_side']:>12,} {r['steps']:>6} {build:>9} {r['diff_s']:>8.2f} "
            f"{r['ops_per_s']:>11,} {r['peak_rss_mib']:>7.1f} MiB  "
            f"{'found' if r['found'] else 'MISSED'}"
        )
    if args.json:
        args.json.write_text(json.dumps({**machine, "rows": rows}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
