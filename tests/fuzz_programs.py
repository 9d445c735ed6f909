"""Small PyTorch training programs generated from a seed, for the mutation fuzzer (issue 37).

A :class:`Program` holds every choice of one program: the model (an MLP, a CNN with BatchNorm, or
a causal language model with attention blocks and embeddings), its norms, activation and dropout,
the optimizer and its options, the scheduler, gradient accumulation, clipping, bf16 autocast,
``torch.compile``, an L2 penalty, and the knobs the mutation catalogue
(``fuzz_mutations.py``) turns: the thread count, the seeds, the batch order, an identity
refactor, a logging line and so on. :func:`render` writes it as a real Python script, so that the
call sites a recorder sees are real lines of a real file, and says which line plays which role
(``opt_step``, ``backward``, ``penalty``, …): the catalogue's answers name lines by role, never by
number, because a mutation that inserts a line moves every line after it.

A program runs on the CPU or, drawn with ``device="cuda"``, on a GPU: there it may also use a fused
optimizer and run its forward on a side stream, and it asks for PyTorch's deterministic algorithms
(cuBLAS's fixed workspace, deterministic cuDNN and index kernels), so that each script computes
the same bits every time it runs: the oracle observes one execution of a script and OpGuard
records another, and the truth must hold for both.

Every script seeds itself and sets its own thread count first, so that many scripts can run one
after the other in one process (``import torch`` costs seconds, a tiny program well under one),
and keeps what the truth oracle compares at module level: ``model``, ``opt`` and ``LOSSES``
(every micro-batch's loss, as ``.item()`` handed it to Python).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

FAMILIES = ("mlp", "cnn", "lm")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULERS = ("none", "step", "exponential", "multistep")
LOGGING = ("none", "loss", "grad_norm", "activation")
REORDERS = ("none", "slices", "item")


@dataclass(frozen=True)
class Program:
    """Every choice of one generated program. The fields after ``compile`` are what mutations
    change; their defaults are the unmutated program."""

    seed: int
    family: str = "mlp"
    width: int = 16
    depth: int = 1
    norm: str = "none"  # "none", "layer", "rms" (nn.RMSNorm), "rms_manual"; CNNs: BatchNorm
    activation: str = "relu"  # "relu", "gelu", "tanh", "silu"
    dropout: float = 0.0
    attention: str = "sdpa"  # language models: "sdpa" or "manual" (written out, masked)
    pool: str = "avg"  # CNNs: "avg" or "max"
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    foreach: bool | None = None
    scheduler: str = "none"
    gamma: float = 0.5
    clip: float | None = None
    accum: int = 1
    steps: int = 3
    batch: int = 4
    autocast: bool = False
    compile: bool = False
    penalty: bool = False
    device: str = "cpu"  # "cpu" or "cuda"
    fused: bool = False  # GPUs: the optimizer's fused kernels (``fused=True``)
    side_stream: bool = False  # GPUs: the forward and the loss on a side stream
    # -- what mutations change --------------------------------------------------------------
    threads: int = 1
    init_seed: int = 0
    loop_seed: int = 1
    penalty_reversed: bool = False
    zero_grad: bool = True
    accum_scale: str = "div"  # "div": loss / ACCUM, "mul": loss * (1.0 / ACCUM)
    order: tuple[int, ...] = ()  # the batches' order; () is 0, 1, 2, …
    shift: int = 0  # the inputs' slice starts this many rows later, 0 or 1 (the targets' not)
    reorder: str = "none"
    logging: str = "none"
    times_one: bool = False
    relu_inplace: bool = False
    reshape: bool = False  # CNNs: h.reshape(h.shape[0], -1) for torch.flatten(h, 1)
    linear_swap: bool = False  # the first linear layer as x @ W.T + b for nn.Linear's call
    numpy_step: int | None = None  # after this step, a weight changed through NumPy
    numpy_delta: float = 0.0

    @property
    def batches(self) -> int:
        return self.steps * self.accum

    @property
    def batch_order(self) -> tuple[int, ...]:
        return self.order or tuple(range(self.batches))

    @property
    def uses_relu(self) -> bool:
        return self.activation == "relu"

    @property
    def adaptive(self) -> bool:
        """Adam or AdamW: the optimizers that take ``betas`` and ``eps``."""
        return self.optimizer in ("adam", "adamw")


def generate(seed: int, *, compile_rate: float = 0.0, device: str = "cpu") -> Program:
    """The program of ``seed`` on ``device``: every choice drawn from ``random.Random(seed)``, so
    a seed names a program for good (a failure saved by ``bench/fuzz.py`` is rebuilt from its
    seed). A GPU program draws its own choices after the others: it is the CPU program of its
    seed, moved to the GPU, with those."""
    rng = random.Random(seed)
    family = rng.choice(FAMILIES)
    optimizer = rng.choice(OPTIMIZERS)
    norms = ("batch",) if family == "cnn" else ("none", "layer", "rms", "rms_manual")
    program = Program(
        seed=seed,
        family=family,
        width=rng.choice((8, 16, 32)),
        depth=rng.choice((1, 2)),
        norm=rng.choice(norms) if family != "lm" else rng.choice(norms[1:]),
        activation=rng.choice(("relu", "relu", "gelu", "tanh", "silu")),
        dropout=rng.choice((0.0, 0.0, 0.1)),
        attention=rng.choice(("sdpa", "manual")),
        pool=rng.choice(("avg", "max")),
        optimizer=optimizer,
        lr=rng.choice((0.1, 0.05, 0.01) if optimizer in ("sgd", "momentum") else (1e-2, 3e-3)),
        momentum=rng.choice((0.9, 0.5)),
        nesterov=optimizer == "momentum" and rng.random() < 0.3,
        betas=rng.choice(((0.9, 0.999), (0.8, 0.99))),
        eps=rng.choice((1e-8, 1e-6)),
        weight_decay=rng.choice((0.0, 0.0, 0.01, 0.1)),
        amsgrad=optimizer == "adam" and rng.random() < 0.2,
        foreach=rng.choice((None, None, True, False)),
        scheduler=rng.choice(SCHEDULERS),
        gamma=rng.choice((0.5, 0.8)),
        clip=rng.choice((None, None, 1.0, 0.1)),
        accum=rng.choice((1, 1, 2, 3)),
        steps=rng.choice((3, 4)),
        batch=rng.choice((4, 6)),
        autocast=rng.random() < 0.25,
        compile=rng.random() < compile_rate,
        penalty=rng.random() < 0.5,
        threads=rng.choice((1, 1, 1, 2)),  # two threads cost 10x on a busy machine
        init_seed=rng.randrange(1000),
        loop_seed=rng.randrange(1000),
    )
    if device == "cpu":
        return program
    fused = program.optimizer != "momentum" and rng.random() < 0.4  # no fused nesterov SGD
    return replace(
        program,
        device=device,
        fused=fused,
        foreach=None if fused else program.foreach,
        autocast=program.autocast or rng.random() < 0.33,  # half of them: what GPUs train in
        side_stream=rng.random() < 0.3,
    )


@dataclass(frozen=True)
class Script:
    """A rendered program: its text, and the line of each role (1-based)."""

    text: str
    lines: dict[str, int] = field(hash=False)

    def line(self, role: str) -> int:
        return self.lines[role]


class _Writer:
    """Lines of a script, each optionally tagged with the role a mutation's answer names."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.roles: dict[str, int] = {}

    def add(self, text: str, indent: int = 0, role: str | None = None) -> None:
        self.rows.append("    " * indent + text if text else "")
        if role is not None:
            assert role not in self.roles, f"role {role!r} twice"
            self.roles[role] = len(self.rows)

    def script(self) -> Script:
        return Script("\n".join(self.rows) + "\n", dict(self.roles))


IN_FEATURES, CLASSES, CHANNELS, IMAGE, VOCAB, CONTEXT = 8, 4, 3, 6, 11, 6


def render(p: Program, title: str = "") -> Script:
    """``p`` as a Python script; ``title`` goes into its docstring (the pair and mutation)."""
    w = _Writer()
    w.add(
        f'"""Generated by tests/fuzz_programs.py from seed {p.seed}.{" " + title if title else ""}"""'
    )
    w.add("")
    if p.family == "lm" and p.attention == "manual":
        w.add("import math")
        w.add("")
    if p.device == "cuda":
        w.add("import os")
        w.add("")
    w.add("import torch")
    w.add("import torch.nn.functional as F")
    w.add("from torch import nn")
    w.add("")
    if p.device == "cuda":  # the same bits at every execution (the module doc)
        w.add('os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")')
        w.add("torch.use_deterministic_algorithms(True)")
        w.add("torch.backends.cudnn.benchmark = False")
    w.add(f"torch.set_num_threads({p.threads})", role="threads")
    w.add(f"torch.manual_seed({p.init_seed})", role="seed")
    w.add("")
    w.add("")
    if p.norm == "rms_manual":
        _rms_norm_class(w)
    {"mlp": _mlp, "cnn": _cnn, "lm": _lm}[p.family](w, p)
    _training(w, p)
    return w.script()


def _norm(p: Program, dim: str) -> str:
    return {
        "layer": f"nn.LayerNorm({dim})",
        "rms": f"nn.RMSNorm({dim})",
        "rms_manual": f"RMSNorm({dim})",
    }[p.norm]


def _rms_norm_class(w: _Writer) -> None:
    w.add("class RMSNorm(nn.Module):")
    w.add("def __init__(self, dim):", 1)
    w.add("super().__init__()", 2)
    w.add("self.weight = nn.Parameter(torch.ones(dim))", 2)
    w.add("")
    w.add("def forward(self, x):", 1)
    w.add("return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight", 2)
    w.add("")
    w.add("")


def _activation(w: _Writer, p: Program, indent: int, role: str | None = None) -> None:
    """``h = act(h)``, then the identity refactor ``h = h * 1.0`` where the program has it."""
    call = {
        "relu": "F.relu(h, inplace=True)" if p.relu_inplace else "F.relu(h)",
        "gelu": "F.gelu(h)",
        "tanh": "torch.tanh(h)",
        "silu": "F.silu(h)",
    }[p.activation]
    w.add(f"h = {call}", indent, role=role)
    if role is not None and p.times_one:
        w.add("h = h * 1.0", indent, role="times_one")


def _linear_call(p: Program, layer: str, x: str) -> str:
    """The first linear layer's call, or the same layer written out (``linear_swap``)."""
    if p.linear_swap:
        return f"{x} @ self.{layer}.weight.T + self.{layer}.bias"
    return f"self.{layer}({x})"


def _activation_log(w: _Writer, p: Program, indent: int) -> None:
    if p.logging == "activation":
        w.add("self.seen = h.detach().abs().mean().item()", indent, role="logging")


def _mlp(w: _Writer, p: Program) -> None:
    w.add("class Net(nn.Module):")
    w.add("def __init__(self):", 1)
    w.add("super().__init__()", 2)
    w.add(f"self.fc1 = nn.Linear({IN_FEATURES}, {p.width})", 2, role="first_layer")
    if p.norm != "none":
        w.add(f"self.norm = {_norm(p, str(p.width))}", 2)
    if p.depth > 1:
        w.add(f"self.fc2 = nn.Linear({p.width}, {p.width})", 2)
    w.add(f"self.head = nn.Linear({p.width}, {CLASSES})", 2)
    if p.dropout:
        w.add(f"self.drop = nn.Dropout({p.dropout})", 2)
    w.add("")
    w.add("def forward(self, x):", 1)
    w.add(f"h = {_linear_call(p, 'fc1', 'x')}", 2, role="swap")
    _activation_log(w, p, 2)
    if p.norm != "none":
        w.add("h = self.norm(h)", 2)
    _activation(w, p, 2, role="activation")
    if p.dropout:
        w.add("h = self.drop(h)", 2, role="dropout")
    if p.depth > 1:
        w.add("h = F.gelu(self.fc2(h))", 2)
    w.add("return self.head(h)", 2)
    w.add("")
    w.add("")


def _cnn(w: _Writer, p: Program) -> None:
    pooled = 4 if p.pool == "avg" else (IMAGE // 2) ** 2
    # to 2 x 2 either way; the adaptive pool's backward has no deterministic CUDA kernel
    average = "nn.AdaptiveAvgPool2d(2)" if p.device == "cpu" else f"nn.AvgPool2d({IMAGE // 2})"
    pool = average if p.pool == "avg" else "nn.MaxPool2d(2)"
    w.add("class Net(nn.Module):")
    w.add("def __init__(self):", 1)
    w.add("super().__init__()", 2)
    w.add(f"self.conv1 = nn.Conv2d({CHANNELS}, {p.width}, 3, padding=1)", 2, role="first_layer")
    w.add(f"self.bn1 = nn.BatchNorm2d({p.width})", 2)
    if p.depth > 1:
        w.add(f"self.conv2 = nn.Conv2d({p.width}, {p.width}, 3, padding=1)", 2)
        w.add(f"self.bn2 = nn.BatchNorm2d({p.width})", 2)
    w.add(f"self.pool = {pool}", 2)
    if p.dropout:
        w.add(f"self.drop = nn.Dropout({p.dropout})", 2)
    w.add(f"self.head = nn.Linear({p.width * pooled}, {CLASSES})", 2)
    w.add("")
    w.add("def forward(self, x):", 1)
    w.add("h = self.bn1(self.conv1(x))", 2)
    _activation_log(w, p, 2)
    _activation(w, p, 2, role="activation")
    if p.depth > 1:
        w.add("h = h + F.relu(self.bn2(self.conv2(h)))", 2)
    w.add("h = self.pool(h)", 2)
    flatten = "h.reshape(h.shape[0], -1)" if p.reshape else "torch.flatten(h, 1)"
    w.add(f"h = {flatten}", 2, role="flatten")
    if p.dropout:
        w.add("h = self.drop(h)", 2, role="dropout")
    w.add(f"return {_linear_call(p, 'head', 'h')}", 2, role="swap")
    w.add("")
    w.add("")


def _lm(w: _Writer, p: Program) -> None:
    heads = 2
    w.add("class Block(nn.Module):")
    w.add("def __init__(self):", 1)
    w.add("super().__init__()", 2)
    w.add(f"self.norm1 = {_norm(p, str(p.width))}", 2)
    w.add(f"self.qkv = nn.Linear({p.width}, {3 * p.width})", 2)
    w.add(f"self.proj = nn.Linear({p.width}, {p.width})", 2)
    w.add(f"self.norm2 = {_norm(p, str(p.width))}", 2)
    w.add(f"self.fc = nn.Linear({p.width}, {2 * p.width})", 2)
    w.add(f"self.out = nn.Linear({2 * p.width}, {p.width})", 2)
    if p.dropout:
        w.add(f"self.drop = nn.Dropout({p.dropout})", 2)
    if p.attention == "manual":
        mask = f"torch.ones({CONTEXT}, {CONTEXT}, dtype=torch.bool).triu(1)"
        w.add(f'self.register_buffer("mask", {mask})', 2)
    w.add("")
    w.add("def forward(self, x):", 1)
    w.add("b, t, d = x.shape", 2)
    w.add(f"qkv = {_linear_call(p, 'qkv', 'self.norm1(x)')}", 2, role="swap")
    w.add("q, k, v = qkv.split(d, dim=-1)", 2)
    split = f"b, t, {heads}, d // {heads}"
    w.add(f"q, k, v = (z.view({split}).transpose(1, 2) for z in (q, k, v))", 2)
    if p.attention == "sdpa":
        w.add("y = F.scaled_dot_product_attention(q, k, v, is_causal=True)", 2)
    else:
        w.add(f"scores = q @ k.transpose(-2, -1) / math.sqrt(d // {heads})", 2)
        w.add('scores = scores.masked_fill(self.mask[:t, :t], float("-inf"))', 2)
        w.add("y = scores.softmax(dim=-1) @ v", 2)
    w.add("y = y.transpose(1, 2).reshape(b, t, d)", 2)
    w.add("h = self.proj(y)", 2)
    _activation_log(w, p, 2)
    if p.dropout:
        w.add("h = self.drop(h)", 2, role="dropout")
    w.add("x = x + h", 2)
    w.add("h = self.fc(self.norm2(x))", 2)
    _activation(w, p, 2, role="activation")
    w.add("return x + self.out(h)", 2)
    w.add("")
    w.add("")
    w.add("class Net(nn.Module):")
    w.add("def __init__(self):", 1)
    w.add("super().__init__()", 2)
    w.add(f"self.embed = nn.Embedding({VOCAB}, {p.width})", 2, role="first_layer")
    w.add(f"self.pos = nn.Parameter(torch.zeros({CONTEXT}, {p.width}))", 2)
    w.add(f"self.blocks = nn.ModuleList(Block() for _ in range({p.depth}))", 2)
    w.add(f"self.norm = {_norm(p, str(p.width))}", 2)
    w.add(f"self.head = nn.Linear({p.width}, {VOCAB})", 2)
    w.add("")
    w.add("def forward(self, idx):", 1)
    w.add("x = self.embed(idx) + self.pos", 2)
    w.add("for block in self.blocks:", 2)
    w.add("x = block(x)", 3)
    w.add("return self.head(self.norm(x))", 2)
    w.add("")
    w.add("")


def _optimizer(p: Program) -> str:
    options = [f"lr={p.lr}"]
    if p.optimizer == "momentum":
        options.append(f"momentum={p.momentum}")
        if p.nesterov:
            options.append("nesterov=True")
    if p.adaptive:
        options += [f"betas={p.betas}", f"eps={p.eps}"]
        if p.amsgrad:
            options.append("amsgrad=True")
    if p.weight_decay or p.optimizer == "adamw":
        options.append(f"weight_decay={p.weight_decay}")
    if p.foreach is not None:
        options.append(f"foreach={p.foreach}")
    if p.fused:
        options.append("fused=True")
    kind = {"sgd": "SGD", "momentum": "SGD", "adam": "Adam", "adamw": "AdamW"}[p.optimizer]
    return f"torch.optim.{kind}(model.parameters(), {', '.join(options)})"


def _scheduler(p: Program) -> str:
    scheduler = {
        "step": f"StepLR(opt, step_size=2, gamma={p.gamma})",
        "exponential": f"ExponentialLR(opt, gamma={p.gamma})",
        "multistep": f"MultiStepLR(opt, milestones=[1, 2], gamma={p.gamma})",
    }[p.scheduler]
    return f"torch.optim.lr_scheduler.{scheduler}"


def _data(w: _Writer, p: Program) -> None:
    """The data set, drawn on the CPU (the same on every device) and moved to the program's."""
    rows = p.batches * p.batch + 1  # one row to spare, for a slice shifted by one
    to = "" if p.device == "cpu" else f'.to("{p.device}")'
    if p.family == "lm":
        w.add(f"tokens = torch.randint(0, {VOCAB}, ({rows}, {CONTEXT + 1})){to}")
        w.add("data, target = tokens[:, :-1], tokens[:, 1:]")
    else:
        shape = f"{IN_FEATURES}" if p.family == "mlp" else f"{CHANNELS}, {IMAGE}, {IMAGE}"
        w.add(f"data = torch.randn({rows}, {shape}){to}")
        w.add(f"target = torch.randint(0, {CLASSES}, ({rows},)){to}")


def _loss(p: Program) -> str:
    if p.family == "lm":
        return f"F.cross_entropy(out.float().reshape(-1, {VOCAB}), y.reshape(-1))"
    return "F.cross_entropy(out.float(), y)"


def _training(w: _Writer, p: Program) -> None:
    w.add("model = Net()" if p.device == "cpu" else f'model = Net().to("{p.device}")')
    if p.compile:
        w.add("model = torch.compile(model)")
    w.add(f"opt = {_optimizer(p)}")
    if p.scheduler != "none":
        w.add(f"sched = {_scheduler(p)}")
    _data(w, p)
    w.add(f"ORDER = {list(p.batch_order)}", role="order")
    w.add(f"torch.manual_seed({p.loop_seed})", role="loop_seed")
    w.add("LOSSES = []")
    if p.side_stream:
        w.add("side = torch.cuda.Stream()")
    w.add(f"for step in range({p.steps}):")
    if p.zero_grad:
        w.add("opt.zero_grad()", 1, role="zero_grad")
    else:
        w.add("# opt.zero_grad()  (forgotten)", 1, role="zero_grad")
    w.add(f"for micro in range({p.accum}):", 1)
    w.add(f"start = ORDER[step * {p.accum} + micro] * {p.batch}", 2)
    x_start = f"start + {p.shift}" if p.shift else "start"
    slices = [
        (f"x = data[{x_start} : {x_start} + {p.batch}]", "slice_x"),
        (f"y = target[start : start + {p.batch}]", "slice_y"),
    ]
    for text, role in reversed(slices) if p.reorder == "slices" else slices:
        w.add(text, 2, role=role)
    indent = 2
    if p.side_stream:  # the forward waits for the default stream's work, and it for the forward
        w.add("side.wait_stream(torch.cuda.current_stream())", indent)
        w.add("with torch.cuda.stream(side):", indent)
        indent += 1
    if p.autocast:
        w.add(f'with torch.autocast("{p.device}", dtype=torch.bfloat16):', indent)
        indent += 1
    w.add("out = model(x)", indent, role="model")
    w.add(f"loss = {_loss(p)}", indent, role="loss")
    if p.side_stream:
        w.add("torch.cuda.current_stream().wait_stream(side)", 2)
    if p.penalty:
        params = (
            "reversed(list(model.parameters()))" if p.penalty_reversed else "model.parameters()"
        )
        w.add(f"penalty = sum(p.pow(2).sum() for p in {params})", 2, role="penalty")
        w.add("loss = loss + 1e-4 * penalty", 2)
    item = "LOSSES.append(loss.item())"
    if p.reorder != "item":
        w.add(item, 2, role="item")
    scale = f"loss / {p.accum}" if p.accum_scale == "div" else f"loss * (1.0 / {p.accum})"
    w.add(f"({scale}).backward()", 2, role="backward")
    if p.reorder == "item":
        w.add(item, 2, role="item")
    if p.logging == "grad_norm":
        norms = "torch.stack([q.grad.norm() for q in model.parameters()]).norm()"
        w.add(f'print(f"grad norm {{{norms}.item():.4f}}")', 1, role="logging")
    if p.clip is not None:
        w.add(
            f"torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={p.clip})", 1, role="clip"
        )
    w.add("opt.step()", 1, role="opt_step")
    if p.scheduler != "none":
        w.add("sched.step()", 1, role="sched_step")
    if p.logging == "loss":
        w.add('print(f"step {step} loss {loss.item():.6f}")', 1, role="logging")
    if p.numpy_step is not None:
        w.add(f"if step == {p.numpy_step}:", 1)
        write = f"next(model.parameters()).detach().numpy().flat[0] += {p.numpy_delta}"
        w.add(write, 2, role="numpy")
